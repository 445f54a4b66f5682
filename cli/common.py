"""Pieces shared by the `cacheflow` commands."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from pycacheflow.config import EngineConfig
from pycacheflow.errors import CacheFlowError

if TYPE_CHECKING:
    from pycacheflow.llm import LLM


def to_click_error(exc: CacheFlowError) -> click.ClickException:
    """A runtime failure as the one-line `Error: <Type>: <message>` click prints (exit 1)."""
    # Native InvalidArgument on init/submit is still a runtime failure from the user's view.
    return click.ClickException(f"{type(exc).__name__}: {exc}")


def load_llm(model: Path | None, config_kwargs: dict[str, object]) -> LLM:
    """Build the engine for a command (model None = the default model, fetched if needed).

    Raises:
        click.UsageError: a bad config value (exit 2).
        click.ClickException: the library or the model could not be loaded (exit 1).
    """
    try:
        if model is None:
            from pycacheflow.model_hub import ensure_default_model

            model = ensure_default_model(progress=True)
        config = EngineConfig(model=model, **config_kwargs)
    except (ValueError, TypeError) as exc:
        raise click.UsageError(str(exc)) from None
    except CacheFlowError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        from pycacheflow.llm import LLM

        return LLM(config=config)
    except ImportError as exc:
        raise click.ClickException(str(exc)) from None
    except CacheFlowError as exc:
        raise to_click_error(exc) from None
