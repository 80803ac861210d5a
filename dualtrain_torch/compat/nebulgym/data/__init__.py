"""nebulgym's ``data`` package: `base`, `nebuly_dataset` and `bagua_dataset`."""
