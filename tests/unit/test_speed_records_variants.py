"""benchmarks/speed_records.py's JPEG part measures first what a user gets without --decode: its rows named only
the decoders asked for by name (nvImageCodec, nvJPEG, CPU), never the JPEG engines `--decode auto` chooses on an
H100/H200, so the part said nothing of cnnpar's default."""

import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from speed_records import jpeg_variants  # noqa: E402


def test_the_jpeg_part_leads_with_the_default_decoder_then_each_named_one(tmp_path):
    store = tmp_path / "p.cnnpar"
    store.write_bytes(b"")
    args = types.SimpleNamespace(folder="photos", workers=14, store=str(store))
    variants = jpeg_variants(args)
    assert variants[0] == ("default", "photos", "auto", 14)
    assert [v[2] for v in variants[1:] if v[0] != "nvimgcodec"] == ["gpu", "cpu", "auto"]
    assert variants[-1] == ("store", str(store), "auto", -1)
