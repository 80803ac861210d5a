"""nebulgym's first ``annotations`` package (its technical README): `torch_annotations`."""
