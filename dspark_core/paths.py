"""Where the committed models live: the reference tiny models and the drafters of fetched models."""

from pathlib import Path

ASSETS = Path(__file__).parent / "assets" / "tiny"  # the committed reference models (build-tiny)
MODEL_ASSETS = Path(__file__).parent / "assets"  # <name>/drafters/<head> + <name>/draft: drafters of fetched models
