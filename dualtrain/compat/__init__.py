"""Other tools' APIs on dualtrain: change the import prefix, keep the code.

`dualtrain.compat.nebulae` mirrors Nebulae v0.5's packages (``fuel``, ``astrobase``,
``cockpit``, ``aerolog``, ``law``, ``toolkit``; the brochure's ``astro`` and ``kit`` too).
The torch-only tools live with the torch adapter, in `dualtrain_torch.compat`: ``nebulgym``,
``torchmb`` and ``speedtorch``. ``import dualtrain`` loads none of this, and importing a
compat package loads a framework only where the tool's module needed one.
"""
