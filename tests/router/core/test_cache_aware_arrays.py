"""cache_aware scores its candidates as arrays: the ranking and the routed-work tie-break
equal the documented rule written one candidate at a time, ties and the guard included."""

import math
import random

import numpy as np
import pytest

from router.core.config import RouterConfig
from router.core.index import PrefixMatch
from router.core.policies import ReplicaView, RouteQuery, cache_aware, make_policy
from router.core.prefix_match import PrefixMatches


class _Reference:
    """The rule as the policy's docstring states it, with plain Python keys."""

    def __init__(self, config: RouterConfig):
        self.config = config
        self.routed: dict[str, float] = {}

    def prefill(self, match, num_prompt_tokens):
        if match is None:
            return float(num_prompt_tokens)
        device, host = match.hit_tokens(self.config.block_size, num_prompt_tokens)
        return num_prompt_tokens - device - host + self.config.host_cost_fraction * host

    def rank(self, query, view):
        ids = query.replica_ids
        prefills = [self.prefill(view.matches.get(r), query.num_prompt_tokens) for r in ids]
        loads = [view.load(r) for r in ids]
        keys = [(prefills[i] + self.config.load_weight * loads[i], loads[i],
                 self.routed.get(r, 0.0), i) for i, r in enumerate(ids)]
        order = [k[3] for k in sorted(keys)]
        if self.config.imbalance_threshold != math.inf:
            least = min(range(len(ids)),
                        key=lambda i: (loads[i], prefills[i], self.routed.get(ids[i], 0.0), i))
            gap = loads[order[0]] - loads[least]
            if gap > self.config.imbalance_threshold and (
                    prefills[least] - prefills[order[0]] < gap):
                order.remove(least)
                order.insert(0, least)
        best = ids[order[0]]
        self.routed[best] = self.routed.get(best, 0.0) + prefills[order[0]] + query.max_tokens
        return [ids[i] for i in order]


@pytest.mark.parametrize("in_python_up_to", [cache_aware._SCORED_IN_PYTHON, 0, 1 << 20])
@pytest.mark.parametrize("as_arrays", [False, True])
@pytest.mark.parametrize("threshold", [math.inf, 300.0])
def test_array_ranking_equals_the_rule_candidate_by_candidate(threshold, as_arrays,
                                                              in_python_up_to, monkeypatch):
    """A few candidates are scored in Python lists, more as arrays: as the policy splits
    them, then every ranking one way, then every ranking the other."""
    monkeypatch.setattr(cache_aware, "_SCORED_IN_PYTHON", in_python_up_to)
    if as_arrays:  # price every PrefixMatches as arrays, however few
        monkeypatch.setattr(cache_aware, "_ARRAY_PRICING_FROM", 1)
    rng = random.Random(7)
    config = RouterConfig(policy="cache_aware", block_size=16, load_weight=0.5,
                          imbalance_threshold=threshold)
    policy, reference = make_policy("cache_aware", config), _Reference(config)
    replicas = [f"r{i}" for i in range(40)]
    num_guarded = 0
    for step in range(400):
        ids = rng.sample(replicas, rng.randint(1, len(replicas)))
        # many ties; 32 tokens of load cost what one cached block saves (cost ties)
        loads = {r: rng.choice([0.0, 32.0, 100.0, rng.random() * 2000]) for r in ids}
        matches = {r: PrefixMatch(rng.randint(0, 40), rng.randint(0, 10))
                   for r in rng.sample(replicas, rng.randint(0, 10))}  # some not candidates
        query = RouteQuery(f"q{step}", [], rng.choice([16, 300, 640]), rng.randint(0, 64), ids)
        view = ReplicaView(matches, loads.__getitem__)
        want = reference.rank(query, view)
        if as_arrays:  # as the index answers (its own candidates only, here some others too)
            view = view._replace(matches=PrefixMatches(
                list(matches), np.array([m.num_device_blocks for m in matches.values()]),
                np.array([m.num_cached_blocks for m in matches.values()], np.int64)))
        assert policy.rank(query, view) == want
        num_guarded += min(ids, key=lambda r: loads[r]) == want[0] != min(
            ids, key=lambda r: (reference.prefill(matches.get(r), query.num_prompt_tokens)
                                + 0.5 * loads[r]))
    assert policy._routed_tokens == reference.routed
    assert threshold == math.inf or num_guarded, "the guard never moved a request"
