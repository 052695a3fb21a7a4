"""`tba local` on real servers: the buffer on Redis, weights in SeaweedFS over S3, and the
searcher generating with vLLM on CPU, all started by the tests."""

import json

import redis

from tests.fixtures.local_run import run_local

STEPS = 6


def test_local_run_on_redis_seaweedfs_and_vllm(tmp_path, demo_base_model, redis_server, seaweedfs):
    env = {
        "TBA_OBJECTSTORE__ENDPOINT_URL": seaweedfs.endpoint_url,
        "TBA_OBJECTSTORE__REGION": seaweedfs.region,
        "TBA_OBJECTSTORE__ACCESS_KEY_ID": seaweedfs.access_key_id,
        "TBA_OBJECTSTORE__SECRET_ACCESS_KEY": seaweedfs.secret_access_key,
        "TBA_OBJECTSTORE__CREATE_BUCKET": "true",
    }
    result = run_local(
        tmp_path / "run",
        "--model",
        str(demo_base_model),
        "--steps",
        str(STEPS),
        "--store",
        redis_server.url,
        "--objectstore",
        "s3://tba-local/weights",
        "--engine",
        "vllm",
        "--set",
        "engine.enforce_eager=true",
        "--set",
        "engine.cpu_kvcache_gib=0.5",
        env=env,
    )
    assert result.summary["steps"] == STEPS
    assert len(result.evaluations()) >= 2, "published versions were fetched from S3 and scored"
    searcher_log = result.log("searcher-0")
    assert "engine vllm" in searcher_log
    assert seaweedfs.secret_access_key not in result.output
    assert seaweedfs.secret_access_key not in (tmp_path / "run" / "trainer.toml").read_text()
    stored = redis.Redis.from_url(redis_server.url)
    assert stored.dbsize() > 0, "the buffer kept its state in Redis"
    versions = [json.loads(line)["version"] for line in (tmp_path / "run" / "eval.jsonl").open()]
    assert versions == sorted(versions)
