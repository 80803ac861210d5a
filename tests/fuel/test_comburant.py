"""Comburant and its transforms: each transform's law, one draw per sample, seeded keys."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from dualtrain import ArgumentError, DtypeError, ShapeError
from dualtrain.fuel import (
    Brighten,
    Comburant,
    Contrast,
    Crop,
    Flip,
    Rotate,
    SampleKey,
    Sampling,
    Saturate,
)

images = hnp.arrays(
    np.uint8,
    st.tuples(st.integers(2, 12), st.integers(2, 12), st.sampled_from([1, 3, 4])).map(tuple),
)
keys = st.tuples(st.integers(0, 2**32), st.integers(0, 50), st.integers(0, 10**6))
ALL = (Flip(True, True), Crop(), Rotate(30), Brighten(0.3), Contrast(0.5), Saturate(0.5))


@given(images, keys)
def test_every_transform_keeps_shape_and_dtype_and_is_deterministic(image, key):
    for t in ALL:
        out = Comburant(t)(image, key=key)
        assert out.shape == image.shape and out.dtype == np.uint8
        np.testing.assert_array_equal(out, Comburant(t)(image, key=key))
    grey = image[..., 0]
    assert Comburant(*ALL)(grey, key=key).shape == grey.shape


@given(images, keys)
def test_flip_twice_is_identity(image, key):
    flip = Flip(True, True, p=0.5)
    params = flip.draw(np.random.default_rng(key[2]), image.shape)
    np.testing.assert_array_equal(flip.apply(flip.apply(image, params), params), image)
    np.testing.assert_array_equal(Comburant(Flip(p=1.0))(image, key=key), image[:, ::-1])
    np.testing.assert_array_equal(Comburant(Flip(False, True, 1.0))(image, key=key), image[::-1])


@given(images, keys)
def test_neutral_settings_are_identity(image, key):
    for t in (Brighten(0), Contrast(0), Saturate(0), Rotate(0), Crop(area=(1, 1), ratio=(1, 1))):
        if isinstance(t, Crop) and image.shape[0] != image.shape[1]:
            continue  # a whole-image crop exists only for aspect ratio 1
        np.testing.assert_array_equal(Comburant(t)(image, key=key), image)


@given(images, st.floats(-1, 1), st.floats(0, 3), st.floats(0, 3))
def test_photometric_transforms_saturate_and_never_wrap(image, shift, contrast, saturation):
    b = Brighten((shift, shift)).apply(image, round(shift * 255))
    want = np.clip(image.astype(int) + round(shift * 255), 0, 255)
    colour = slice(0, 3) if image.shape[2] == 4 else slice(None)
    np.testing.assert_array_equal(b[..., colour], want[..., colour])
    c = Contrast((contrast, contrast)).apply(image, contrast)
    s = Saturate((saturation, saturation)).apply(image, saturation)
    assert c.dtype == s.dtype == np.uint8
    ramp = np.arange(256, dtype=np.uint8).reshape(16, 16, 1)
    for t, p in ((Contrast(3), contrast), (Brighten(1), round(shift * 255))):
        assert np.all(np.diff(t.apply(ramp, p).ravel().astype(int)) >= 0)  # order kept
    if image.shape[2] == 4:  # alpha is not a colour
        np.testing.assert_array_equal(b[..., 3], image[..., 3])
        np.testing.assert_array_equal(c[..., 3], image[..., 3])
        np.testing.assert_array_equal(s[..., 3], image[..., 3])


def test_saturate_keeps_grey_pixels():
    grey = np.repeat(np.arange(0, 250, 10, dtype=np.uint8)[None, :, None], 3, axis=2)
    out = Saturate((2.5, 2.5)).apply(grey, 2.5)
    np.testing.assert_array_equal(out, grey)


@given(images, keys)
def test_one_draw_moves_image_and_mask_together(image, key):
    mask = image[..., 0].copy()
    flipped, moved = Comburant(Flip(True, True))(image, mask, key=key)
    np.testing.assert_array_equal(moved, flipped[..., 0])
    _, kept = Comburant(Brighten(0.5), Contrast(0.5), Saturate(0.5))(image, mask, key=key)
    np.testing.assert_array_equal(kept, mask)  # photometric draws leave masks be
    _, cropped = Comburant(Crop(), Rotate(20))(image, mask, key=key)
    assert cropped.shape == mask.shape
    assert set(np.unique(cropped)) <= set(np.unique(mask)) | {0}  # nearest: no new labels


def test_sequences_share_one_draw_and_sampling_keeps_every_theta():
    frames = np.stack([np.full((4, 5, 3), 10 * i, np.uint8) for i in range(10)])
    frames[:, 0, 0] = 255  # a marker a flip moves
    aug = Comburant(Sampling(3), Flip(p=1.0), Brighten((0.1, 0.1)))
    out = aug(frames, key=(0, 0, 7))
    start = Sampling(3).draw(__import__("dualtrain").fuel.streams.stream(
        0, 2, 0, 7, 0), frames.shape)  # fmt: skip
    kept = list(range(start, 10, 3))
    assert out.shape == (len(kept), 4, 5, 3)
    for got, i in zip(out, kept, strict=True):
        want = np.clip(frames[i][:, ::-1].astype(int) + round(0.1 * 255), 0, 255)
        np.testing.assert_array_equal(got, want)
    listed = aug(list(frames), key=(0, 0, 7))
    assert isinstance(listed, list) and len(listed) == len(kept)


def test_keys_name_the_draws():
    image = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    aug = Comburant(Crop(area=(0.2, 0.9)), Brighten(0.5))
    outs = {aug(image, key=(1, e, i)).tobytes() for e in range(3) for i in range(5)}
    assert len(outs) > 10  # different (epoch, index) give different draws
    same = aug(image, key=SampleKey(1, 2, 3))
    np.testing.assert_array_equal(same, aug(image, key=(1, 2, 3)))


def test_bad_input_is_named():
    image = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(ArgumentError, match="key"):
        Comburant(Flip())(image)  # outside a Tank, no key
    with pytest.raises(ArgumentError, match="key"):
        Comburant(Flip())(image, key=(1, -1, 0))
    with pytest.raises(DtypeError, match="uint8"):
        Comburant(Flip())(image.astype(np.float32), key=(0, 0, 0))
    with pytest.raises(ShapeError, match="image"):
        Comburant(Flip())(np.zeros(4, np.uint8), key=(0, 0, 0))
    with pytest.raises(ArgumentError, match="sequences"):
        Comburant(Sampling(2))(image, key=(0, 0, 0))
    with pytest.raises(ArgumentError, match="transforms"):
        Comburant(lambda x: x)
    with pytest.raises(ArgumentError, match="p must be"):
        Flip(p=2)
    with pytest.raises(ArgumentError, match="theta"):
        Sampling(0)
    with pytest.raises(ArgumentError, match="area"):
        Crop(area=(0.5, 2.0))


@settings(max_examples=10)
@given(st.integers(0, 2**31))
def test_streams_do_not_overlap(seed):
    from dualtrain.fuel.streams import AUGMENT, ORDER, stream

    draws = [
        stream(seed, AUGMENT, 0, 1, 0).random(4), stream(seed, AUGMENT, 1, 0, 0).random(4),
        stream(seed, AUGMENT, 0, 0, 1).random(4), stream(seed, ORDER, 0, 1, 0).random(4),
        stream(seed + 1, AUGMENT, 0, 1, 0).random(4),
    ]  # fmt: skip
    assert len({d.tobytes() for d in draws}) == len(draws)


# --- issue 11: channel layouts, and parameters checked at construction ----------------------


def test_channel_first_images_are_refused_unless_the_layout_is_told():
    chw = np.zeros((3, 32, 32), np.uint8)
    with pytest.raises(ShapeError, match="channel-first"):
        Comburant(Flip(p=1.0))(chw, key=(0, 0, 0))
    with pytest.raises(ShapeError, match="channel-first"):
        Comburant(Flip(p=1.0))(np.zeros((5, 3, 32, 32), np.uint8), key=(0, 0, 0))
    with pytest.raises(ArgumentError, match="key"):
        Comburant(Flip())(np.zeros((4, 4, 3), np.uint8), key=(0, True, 0))
    wide = Comburant(Flip(p=1.0), layout="HWC")(chw, key=(0, 0, 0))  # 32 channels: as told
    assert wide.shape == chw.shape
    with pytest.raises(ArgumentError, match="layout"):
        Comburant(Flip(), layout="NCHW")


@settings(max_examples=20)
@given(images, keys)
def test_chw_layout_augments_as_the_hwc_image_would(image, key):
    chw = np.ascontiguousarray(image.transpose(2, 0, 1))
    aug = (Flip(True, True), Crop(), Rotate(30), Brighten(0.3), Contrast(0.5), Saturate(0.5))
    hwc_out = Comburant(*aug)(image, key=key)
    chw_out = Comburant(*aug, layout="CHW")(chw, key=key)
    assert chw_out.shape == chw.shape
    np.testing.assert_array_equal(chw_out, hwc_out.transpose(2, 0, 1))
    mask = image[..., 0].copy()
    _, moved = Comburant(Flip(True, True), layout="CHW")(chw, mask, key=key)
    _, want = Comburant(Flip(True, True))(image, mask, key=key)
    np.testing.assert_array_equal(moved, want)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Brighten(2.0),
        lambda: Brighten(-0.1),
        lambda: Brighten(float("nan")),
        lambda: Brighten((-2.0, 0.0)),
        lambda: Brighten(True),
        lambda: Contrast(float("inf")),
        lambda: Contrast(1e9),
        lambda: Contrast((1.0, float("nan"))),
        lambda: Saturate(-1),
        lambda: Saturate((2.0, 1.0)),
        lambda: Rotate(float("nan")),
        lambda: Rotate(720),
        lambda: Rotate((0, True)),
        lambda: Crop(area=(float("nan"), 1.0)),
        lambda: Crop(area=(0.0, 0.0)),
        lambda: Crop(ratio=(0.0, 1.0)),
        lambda: Crop(ratio=(1.0, float("inf"))),
        lambda: Flip(p=float("nan")),
        lambda: Flip(p=True),
        lambda: Flip(p="0.5"),
        lambda: Flip(horizontal="yes"),
        lambda: Flip(vertical=None),
        lambda: Sampling(True),
        lambda: Sampling(2.0),
    ],
)
def test_bad_transform_parameters_fail_at_construction(make):
    with pytest.raises(ArgumentError):
        make()


@given(st.floats(0, 1), images, keys)
def test_any_accepted_brighten_runs(delta, image, key):
    out = Comburant(Brighten(delta))(image, key=key)
    assert out.shape == image.shape


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_key_seeds_outside_the_seed_range_are_refused(seed):
    image = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(ArgumentError, match="key"):
        Comburant(Flip())(image, key=(seed, 0, 0))


# --- adversarial round 2: sizes that do not match, channel-last under layout="CHW" -------


@pytest.mark.parametrize("mask_shape", [(7, 9), (8, 10), (9, 9, 1), (4, 9, 3)])
@pytest.mark.parametrize("transform", [Flip(p=1.0), Crop(area=(0.3, 0.5)), Rotate(30)])
def test_a_mask_of_another_size_is_a_shape_error_naming_both_shapes(transform, mask_shape):
    image = np.zeros((8, 9, 3), np.uint8)
    with pytest.raises(ShapeError, match=rf"{re.escape(str(mask_shape))}.*\(8, 9, 3\)"):
        Comburant(transform)(image, np.zeros(mask_shape, np.uint8), key=(0, 0, 0))


def test_frames_of_different_sizes_are_a_shape_error():
    x = np.zeros((8, 9, 3), np.uint8)
    with pytest.raises(ShapeError, match=r"frame 1 .*\(4, 9, 3\)"):
        Comburant(Flip(p=1.0))([x, x[:4]], key=(0, 0, 0))
    with pytest.raises(ShapeError, match=r"mask frame 1"):
        Comburant(Flip(p=1.0))([x, x], [x[..., 0], x[:4, :, 0]], key=(0, 0, 0))


@pytest.mark.parametrize("shape", [(8, 9, 3), (8, 9, 1), (2, 8, 9, 4)])
def test_layout_chw_refuses_a_channel_last_array(shape):
    with pytest.raises(ShapeError, match="channel-last"):
        Comburant(Saturate(0.5), layout="CHW")(np.zeros(shape, np.uint8), key=(0, 0, 0))
    Comburant(Saturate(0.5), layout="CHW")(np.zeros((3, 8, 9), np.uint8), key=(0, 0, 0))
