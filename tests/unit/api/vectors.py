"""The release encoder's rendered prompts and parsed completions (copied from
shared/reference/dsv4-chat-vectors.json so the suite runs anywhere)."""

import json
from pathlib import Path

VECTORS = json.loads((Path(__file__).parent / "dsv4_chat_vectors.json").read_text("utf-8"))
RENDER = VECTORS["render"]
PARSE = VECTORS["parse"]
