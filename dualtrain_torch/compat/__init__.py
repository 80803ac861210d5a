"""Drop-in replacements for other tools' APIs, built on dualtrain (torch side).

`speedtorch` (SpeedTorch's factories on the EmbeddingStore) and `torchmb` (torchmb's
model batcher on `dualtrain_torch.BatchModule`): change the import, keep the code.
"""
