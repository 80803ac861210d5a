"""Where a verification thread that swallows its stops may be parked at exit (#30).

Parking blocks the thread for good, holding whatever locks it holds: only the user's own
code, called from no code that holds a lock while it calls out, is a place to park.
"""

from __future__ import annotations

import functools
import logging
import sys
import types

from dualtrain.accelerate import verification


def frame_of(fn):
    """The frame `fn` runs in, as a trace function's "call" event would see it."""
    seen = []

    def body():
        seen.append(sys._getframe())

    fn(body)
    return seen[0]


def direct(body):
    body()


def test_the_users_own_code_called_plainly_is_parkable():
    assert verification._parkable(frame_of(direct))


def test_code_below_a_lock_holding_caller_is_not_parkable():
    class Lazy:
        def __init__(self, body):
            self.body = body

        @functools.cached_property
        def value(self):  # Python 3.11 holds one lock for every instance here
            self.body()

    assert not verification._parkable(frame_of(lambda body: Lazy(body).value))

    class Calling(logging.Handler):
        def __init__(self, body):
            super().__init__()
            self.body = body

        def emit(self, record):  # the handler's lock is held around emit
            self.body()

    def logged(body):
        log = logging.getLogger("parking-test")
        handler = Calling(body)
        log.addHandler(handler)
        try:
            log.warning("x")
        finally:
            log.removeHandler(handler)

    assert not verification._parkable(frame_of(logged))


def test_code_of_installed_packages_and_of_dualtrain_is_not_parkable():
    for path in (
        "/opt/env/lib/python3.11/site-packages/lib.py",
        "/usr/lib/python3/dist-packages/lib.py",
    ):
        module = types.ModuleType("lib")
        exec(compile("def run(body):\n    body()\n", path, "exec"), module.__dict__)
        frame = frame_of(lambda body, module=module: module.run(lambda: body()))
        assert verification._parkable(frame)  # the user's lambda below it: its own code
        caught = []
        module.__dict__["sys"] = sys
        exec(
            compile("def here(out):\n    out.append(sys._getframe())\n", path, "exec"),
            module.__dict__,
        )
        module.here(caught)
        assert not verification._parkable(caught[0])
    assert not verification._parkable(sys._getframe().f_back)  # pytest's own frames
    ours = types.ModuleType("dualtrain.fake")
    exec(compile("import sys\ndef here():\n    return sys._getframe()\n", "/x/fake.py", "exec"),
         ours.__dict__)  # fmt: skip
    ours.__dict__["__name__"] = "dualtrain.fake"
    assert not verification._parkable(ours.here())


def test_a_frame_whose_module_name_is_not_text_is_judged_not_raised():
    module = types.ModuleType("odd")
    exec(compile("import sys\ndef here():\n    return sys._getframe()\n", "/x/odd.py", "exec"),
         module.__dict__)  # fmt: skip
    module.__dict__["__name__"] = None
    assert verification._parkable(module.here()) in (True, False)
