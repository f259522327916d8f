"""The demo's filesystem broker: a message is read whole or not at all (kombu#1551)."""

from __future__ import annotations

import os
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection

from demo_project import broker


def test_a_message_is_invisible_to_a_consumer_until_it_is_written_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = str(tmp_path)
    options = {"data_folder_in": folder, "data_folder_out": folder, "store_processed": False}
    with Connection("filesystem://", transport=broker.TRANSPORT, transport_options=options) as c:
        channel: Any = c.default_channel
        real_replace = os.replace
        looked: list[str] = []

        def replace(source: str, target: str) -> None:
            # the file is written, not yet renamed: a consumer polling now finds nothing
            # (kombu's own _put would have shown it an empty file under its final name)
            with pytest.raises(Empty):
                channel._get("orders")
            looked.append(Path(source).read_text())
            real_replace(source, target)

        monkeypatch.setattr(os, "replace", replace)  # the module calls os.replace
        channel._put("orders", {"body": "paid"})
        assert looked == ['{"body": "paid"}']
        assert channel._get("orders") == {"body": "paid"}
        assert os.listdir(folder) == []  # read and removed; no partial file left behind
