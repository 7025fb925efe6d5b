"""The local evaluation account of `eqrisk demo`: an ordinary verified account, with the
starting credit and one key, made in the demo's own home so that a newcomer can use every route
and every page without the shared demo key's limits (5 requests a minute, seven tickers).

Nothing here runs unless `eqrisk demo` asks: `eqrisk serve` never creates an account or a key.
The demo keeps the key in a file of its home and gives it again on the next run while it still
opens a usable account (not revoked, account not suspended), so that a second `eqrisk demo`
does not pile up accounts.
"""

from __future__ import annotations

from typing import Any

from eqrisk.accounts.book import DEFAULT_RATE_LIMIT, Accounts
from eqrisk.accounts.pricing import tokens_to_usd

EVALUATION_ACCOUNT_NAME = "Local evaluation (eqrisk demo)"
EVALUATION_KEY_LABEL = "local evaluation key"
EVALUATION_PROVIDER = "eqrisk-demo"  # the card check of a demo home: nobody's card


def ensure_evaluation_key(accounts: Accounts, stored: str | None) -> dict[str, Any]:
    """The evaluation key: `stored` again when it still opens a usable account of its own,
    else a new verified account (granted the starting credit) with a new key.

    Returns `key`, `key_id`, `account_id`, `rate_limit`, `balance_usd` and `created` (True when
    this call made the account)."""
    record = accounts.authenticate(stored) if stored else None
    if record is not None and record.account_state == "verified" and not record.is_demo:
        return {
            "key": stored,
            "key_id": record.key_id,
            "account_id": record.account_id,
            "rate_limit": record.rate_limit,
            "balance_usd": tokens_to_usd(record.balance_tokens),
            "created": False,
        }
    account_id = accounts.create_account(EVALUATION_ACCOUNT_NAME)["account_id"]
    accounts.verify_card(account_id, provider=EVALUATION_PROVIDER)
    made = accounts.create_key(
        account_id, label=EVALUATION_KEY_LABEL, rate_limit=DEFAULT_RATE_LIMIT
    )
    return {
        "key": made["key"],
        "key_id": made["key_id"],
        "account_id": account_id,
        "rate_limit": made["rate_limit"],
        "balance_usd": tokens_to_usd(accounts.balance(account_id)),
        "created": True,
    }
