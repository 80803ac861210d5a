"""The dock layer specs, one module per kind; `dualtrain.craft.dock` is their public home.

``base`` holds `Layer` (with the ``check_input`` contract) and the field checks the specs
share; ``linear`` Dense and Embedding; ``conv`` Conv and ConvTranspose; ``pool`` the window
and global pools; ``norm`` BatchNorm and LayerNorm; ``shape`` Reshape and Flatten;
``dropout`` Dropout; ``containers`` Sequential and Native. Import them from
`dualtrain.craft.dock`: this package's layout is not public.
"""
