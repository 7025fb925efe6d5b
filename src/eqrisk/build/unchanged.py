"""`eqrisk build` with nothing new: the ingested data set and every setting the model reads are
those the current version was built from, so a build would publish a copy of it (and prune an
older version to make room). The build says so instead and changes nothing.

What a version was built from is its data set's proof (`tail.data_proof`: the digest of every
partition file, the return breaks, the share classes) with one more entry, `settings`: a digest
of the method, the market ETF, the classified security master (the sector maps' result) and
the chunk grid's block, and the served risk model's settings (`RiskParams.served()`, every
field: a release that changes how F or D is estimated builds again even on the same data). A
version written before that entry never matches: its next build publishes, as before.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

import eqrisk
from eqrisk.build.incremental import digest
from eqrisk.model.risk_model import RiskParams
from eqrisk.model.run import ModelParams
from eqrisk.snapshot.store import Previous


class NothingNew(Exception):
    """A build found nothing new: `version` (the current one) was built from the same."""

    def __init__(self, version: str) -> None:
        super().__init__(version)
        self.version = version

    def line(self) -> str:
        return (
            f"nothing new: the ingested data and the settings are those of {self.version} "
            "(current); no version published, none pruned"
        )


def settings_digest(
    params: ModelParams, master: pd.DataFrame, market_etf: str, block_symbols: int
) -> str:
    rows = pd.util.hash_pandas_object(master.astype(str), index=True).to_numpy()
    return digest(
        eqrisk.__version__,
        params.describe(),
        repr(RiskParams.served()),
        market_etf,
        block_symbols,
        list(master.columns),
        rows,
    )


def with_settings(proof: dict[str, Any] | None, settings: str) -> dict[str, Any] | None:
    """The data set's proof with the settings' digest (None stays None: no proof, no match)."""
    return None if proof is None else {**proof, "settings": settings}


def built_from(previous: Previous, proof: dict[str, Any] | None) -> str | None:
    """The current version's name when it was built from exactly `proof`, else None."""
    snapshot = previous.snapshot
    if proof is None or snapshot is None or previous.folder is None:
        return None
    if previous.current != previous.folder.name:  # CURRENT names a version that does not open
        return None
    recorded = (snapshot.manifest.get("inputs") or {}).get("data")
    return previous.folder.name if recorded == proof else None
