"""Domain types <-> protobuf messages. Pure translation, no validation."""

from __future__ import annotations

import dataclasses
import math

from tba import domain, runs
from tba.v1 import buffer_pb2 as pb


def prompt_to_pb(prompt: domain.Prompt) -> pb.Prompt:
    return pb.Prompt(id=prompt.id, text=prompt.text, answer=prompt.answer)


def prompt_from_pb(msg: pb.Prompt) -> domain.Prompt:
    return domain.Prompt(id=msg.id, text=msg.text, answer=msg.answer)


def trajectory_to_pb(t: domain.Trajectory) -> pb.Trajectory:
    return pb.Trajectory(
        id=t.id,
        prompt_id=t.prompt_id,
        prompt_token_ids=t.prompt_token_ids,
        completion_token_ids=t.completion_token_ids,
        completion_text=t.completion_text,
        reward=t.reward,
        ref_logprob=t.ref_logprob,
        behavior_logprob=t.behavior_logprob,
        policy_version=t.policy_version,
        searcher_id=t.searcher_id,
        finish_reason=int(t.finish_reason),  # type: ignore[arg-type]
        created_at_s=t.created_at_s,
        behavior_token_logprobs=t.behavior_token_logprobs,
        ref_token_logprobs=t.ref_token_logprobs,
        sampling_temperature=t.sampling_temperature,
    )


def trajectory_from_pb(msg: pb.Trajectory) -> domain.Trajectory:
    return domain.Trajectory(
        id=msg.id,
        prompt_id=msg.prompt_id,
        prompt_token_ids=msg.prompt_token_ids,
        completion_token_ids=msg.completion_token_ids,
        completion_text=msg.completion_text,
        reward=msg.reward,
        ref_logprob=msg.ref_logprob,
        behavior_logprob=msg.behavior_logprob,
        policy_version=msg.policy_version,
        searcher_id=msg.searcher_id,
        finish_reason=_finish_reason(msg.finish_reason),
        created_at_s=msg.created_at_s,
        behavior_token_logprobs=msg.behavior_token_logprobs,
        ref_token_logprobs=msg.ref_token_logprobs,
        sampling_temperature=msg.sampling_temperature,
    )


def _finish_reason(value: int) -> domain.FinishReason:
    try:
        return domain.FinishReason(value)
    except ValueError:
        return domain.FinishReason.UNSPECIFIED


def sample_spec_to_pb(spec: domain.SampleSpec) -> pb.SampleRequest:
    msg = pb.SampleRequest(
        num_prompts=spec.num_prompts,
        samples_per_prompt=spec.samples_per_prompt,
        recency_probability=spec.recency_probability,
        min_samples_per_prompt=spec.min_samples_per_prompt,
        min_groups=spec.min_groups,
        wait_s=spec.wait_s,
    )
    if not math.isinf(spec.reward_temperature):
        msg.reward_temperature = spec.reward_temperature
    if spec.max_age_versions is not None:
        msg.max_age_versions = spec.max_age_versions
    if spec.seed is not None:
        msg.seed = spec.seed
    if spec.report is not None:
        msg.trainer_report.CopyFrom(pb.TrainerReport(**dataclasses.asdict(spec.report)))
    return msg


def sample_spec_from_pb(msg: pb.SampleRequest) -> domain.SampleSpec:
    return domain.SampleSpec(
        num_prompts=msg.num_prompts,
        samples_per_prompt=msg.samples_per_prompt,
        recency_probability=msg.recency_probability,
        reward_temperature=(
            msg.reward_temperature if msg.HasField("reward_temperature") else math.inf
        ),
        max_age_versions=msg.max_age_versions if msg.HasField("max_age_versions") else None,
        min_samples_per_prompt=max(1, msg.min_samples_per_prompt),
        seed=msg.seed if msg.HasField("seed") else None,
        report=trainer_report_from_pb(msg.trainer_report)
        if msg.HasField("trainer_report")
        else None,
        min_groups=msg.min_groups,
        wait_s=msg.wait_s,
    )


def trainer_report_from_pb(msg: pb.TrainerReport) -> domain.TrainerReport:
    return domain.TrainerReport(
        step=msg.step,
        loss=msg.loss,
        kl=msg.kl,
        log_z=msg.log_z,
        lr=msg.lr,
        grad_norm=msg.grad_norm,
        step_time_s=msg.step_time_s,
        wait_data_s=msg.wait_data_s,
    )


def batch_to_pb(batch: domain.Batch) -> pb.SampleResponse:
    return pb.SampleResponse(
        groups=[
            pb.PromptGroup(
                prompt=prompt_to_pb(g.prompt),
                trajectories=[trajectory_to_pb(t) for t in g.trajectories],
                source=int(g.source),  # type: ignore[arg-type]
            )
            for g in batch.groups
        ],
        latest_version=batch.latest_version,
        waited_s=batch.waited_s,
    )


def batch_from_pb(msg: pb.SampleResponse) -> domain.Batch:
    return domain.Batch(
        groups=[
            domain.PromptGroup(
                prompt=prompt_from_pb(g.prompt),
                trajectories=[trajectory_from_pb(t) for t in g.trajectories],
                source=domain.SampleSource(g.source),
            )
            for g in msg.groups
        ],
        latest_version=msg.latest_version,
        waited_s=msg.waited_s,
    )


def lease_to_pb(lease: domain.Lease) -> pb.LeasePromptsResponse:
    return pb.LeasePromptsResponse(
        lease_id=lease.lease_id,
        prompts=[prompt_to_pb(p) for p in lease.prompts],
        expires_at_s=lease.expires_at_s,
    )


def lease_from_pb(msg: pb.LeasePromptsResponse) -> domain.Lease:
    return domain.Lease(
        lease_id=msg.lease_id,
        prompts=[prompt_from_pb(p) for p in msg.prompts],
        expires_at_s=msg.expires_at_s,
    )


def add_result_to_pb(result: domain.AddResult) -> pb.AddTrajectoriesResponse:
    return pb.AddTrajectoriesResponse(
        accepted=result.accepted,
        replaced_duplicates=result.replaced_duplicates,
        evicted=result.evicted,
        replayed=result.replayed,
    )


def add_result_from_pb(msg: pb.AddTrajectoriesResponse) -> domain.AddResult:
    return domain.AddResult(
        accepted=msg.accepted,
        replaced_duplicates=msg.replaced_duplicates,
        evicted=msg.evicted,
        replayed=msg.replayed,
    )


def weights_to_pb(w: domain.WeightVersion) -> pb.WeightVersion:
    return pb.WeightVersion(
        version=w.version, uri=w.uri, sha256=w.sha256, step=w.step, published_at_s=w.published_at_s
    )


def weights_from_pb(msg: pb.WeightVersion) -> domain.WeightVersion:
    return domain.WeightVersion(
        version=msg.version,
        uri=msg.uri,
        sha256=msg.sha256,
        step=msg.step,
        published_at_s=msg.published_at_s,
    )


def stats_to_pb(s: domain.BufferStats) -> pb.Stats:
    return pb.Stats(
        trajectories=s.trajectories,
        prompts=s.prompts,
        prompts_with_trajectories=s.prompts_with_trajectories,
        leases_in_flight=s.leases_in_flight,
        reward_mean=s.reward_mean,
        reward_histogram_edges=s.reward_histogram_edges,
        reward_histogram_counts=s.reward_histogram_counts,
        per_version=[
            pb.VersionCount(policy_version=v, trajectories=n)
            for v, n in sorted(s.per_version.items())
        ],
        latest_version=s.latest_version,
        adds_per_s=s.adds_per_s,
        samples_per_s=s.samples_per_s,
        searchers=[
            pb.SearcherInfo(
                searcher_id=x.searcher_id,
                last_seen_s=x.last_seen_s,
                trajectories_added=x.trajectories_added,
            )
            for x in s.searchers
        ],
        trajectories_added_total=s.trajectories_added_total,
        groups_sampled_total=s.groups_sampled_total,
        evicted_total=s.evicted_total,
        run=run_to_pb(s.run) if s.run is not None else None,
    )


def stats_from_pb(msg: pb.Stats) -> domain.BufferStats:
    per_version = {vc.policy_version: vc.trajectories for vc in msg.per_version}
    return domain.BufferStats(
        trajectories=msg.trajectories,
        prompts=msg.prompts,
        prompts_with_trajectories=msg.prompts_with_trajectories,
        leases_in_flight=msg.leases_in_flight,
        reward_mean=msg.reward_mean,
        reward_histogram_edges=list(msg.reward_histogram_edges),
        reward_histogram_counts=list(msg.reward_histogram_counts),
        per_version=per_version,
        latest_version=msg.latest_version,
        searchers=[
            domain.SearcherInfo(x.searcher_id, x.last_seen_s, x.trajectories_added)
            for x in msg.searchers
        ],
        trajectories_added_total=msg.trajectories_added_total,
        groups_sampled_total=msg.groups_sampled_total,
        evicted_total=msg.evicted_total,
        adds_per_s=msg.adds_per_s,
        samples_per_s=msg.samples_per_s,
        run=run_from_pb(msg.run) if msg.HasField("run") else None,
    )


def identity_to_pb(i: runs.RunIdentity) -> pb.RunIdentity:
    return pb.RunIdentity(
        model_source=i.model_source,
        model_revision=i.model_revision,
        tokenizer_sha256=i.tokenizer_sha256,
        task_name=i.task_name,
        prompt_template_sha256=i.prompt_template_sha256,
        temperature=i.temperature,
        max_new_tokens=i.max_new_tokens,
        temperature_low=i.temperature_low,
        temperature_high=i.temperature_high,
        temperature_draw_fraction=i.temperature_draw_fraction,
    )


def identity_from_pb(msg: pb.RunIdentity) -> runs.RunIdentity:
    return runs.RunIdentity(
        model_source=msg.model_source,
        model_revision=msg.model_revision,
        tokenizer_sha256=msg.tokenizer_sha256,
        task_name=msg.task_name,
        prompt_template_sha256=msg.prompt_template_sha256,
        temperature=msg.temperature,
        max_new_tokens=msg.max_new_tokens,
        temperature_low=msg.temperature_low,
        temperature_high=msg.temperature_high,
        temperature_draw_fraction=msg.temperature_draw_fraction,
    )


def run_to_pb(run: runs.Run) -> pb.Run:
    recipe = run.recipe
    return pb.Run(
        run_id=run.run_id,
        identity=identity_to_pb(run.identity),
        recipe=pb.RunRecipe(
            task_json=recipe.task_json, model_json=recipe.model_json, model_seed=recipe.model_seed
        ),
        registered_at_s=run.registered_at_s,
    )


def run_from_pb(msg: pb.Run) -> runs.Run:
    recipe = msg.recipe
    return runs.Run(
        run_id=msg.run_id,
        identity=identity_from_pb(msg.identity),
        recipe=runs.RunRecipe(
            task_json=recipe.task_json or "{}",
            model_json=recipe.model_json or "{}",
            model_seed=recipe.model_seed,
        ),
        registered_at_s=msg.registered_at_s,
    )
