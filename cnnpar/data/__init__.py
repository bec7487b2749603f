"""Data: sources that read the formats people have, loaders that feed the device."""

from cnnpar.data.bundle import ArrayDataset, DataBundle
from cnnpar.data.sources import load_data, load_predict_data

__all__ = ["ArrayDataset", "DataBundle", "load_data", "load_predict_data"]
