"""Batch-aware pricing: alone, joining a batch, beside another model on one GPU:
the default margin pricing with the x2 co-location penalty and the share
pricing (the default from 34a5aff to 83b3f8e, still a setting)."""

from __future__ import annotations

import math

import pytest

from router.curves import Curve
from router.policy import ActionSpec, Caps, Policy
from router.pricing import LoadPricing, Pricing, Site
from router.quality import ExpectedLengths, QualityTable

# The H200 curves' shape: own work A per kilotoken, shared work B per kilotoken / n.
SMALL = Curve("small-1b", "gpu0", "t", "1b", "nvml", "d",
              (0.3, 5.5, 49.0, 4.2, 636.0, 5.9, 0.0))
LARGE = Curve("large-8b", "gpu0", "t", "8b", "nvml", "d",
              (0.0, 28.8, 117.0, 18.5, 2972.0, 29.2, 0.0))
SHARED = {"small-1b": Site(1, frozenset({"large-8b"})),
          "large-8b": Site(1, frozenset({"small-1b"}))}
RANK = {"small-1b": 0, "large-8b": 1}
MARGIN = LoadPricing("margin", colocation_penalty=1.0)


def test_alone_is_the_standalone_curve() -> None:
    p = Pricing(SHARED, RANK, MARGIN).price(SMALL, "small-1b", 100, 64, {})
    assert p.note == "alone" and p.joules == pytest.approx(SMALL.joules(100, 64, 1))


def test_joining_a_running_batch_costs_only_the_requests_own_work() -> None:
    p = Pricing(SHARED, RANK, MARGIN).price(LARGE, "large-8b", 100, 64, {"large-8b": 7})
    c = 64 / 1000
    assert p.note == "joins a batch of 7"
    assert p.joules == pytest.approx(28.8 * 0.1 + 117.0 * c + 18.5 * 0.1 * c)
    # the marginal joules of the batch: (n+1) J(n+1) - n J(n)
    marginal = 8 * LARGE.joules(100, 64, 8) - 7 * LARGE.joules(100, 64, 7)
    assert p.joules == pytest.approx(marginal, rel=1e-6)


def test_beside_the_busy_larger_model_pays_for_the_time_it_takes_from_it() -> None:
    pricing = Pricing(SHARED, RANK, MARGIN)
    p = pricing.price(SMALL, "small-1b", 100, 64, {"large-8b": 7})
    assert p.note == "beside large-8b"
    assert p.joules == pytest.approx(2 * SMALL.joules(100, 64, 1))
    # The small model running too does not make it the lead: the large one leads.
    p = pricing.price(SMALL, "small-1b", 100, 64, {"large-8b": 1, "small-1b": 5})
    assert p.note == "beside large-8b"
    # ...and the large one joins its own batch.
    assert pricing.price(LARGE, "large-8b", 100, 64,
                         {"large-8b": 1, "small-1b": 5}).note == "joins a batch of 1"


def test_waking_the_large_model_beside_a_busy_small_one_is_dearer() -> None:
    p = Pricing(SHARED, RANK, MARGIN).price(LARGE, "large-8b", 100, 64, {"small-1b": 3})
    assert p.note == "beside small-1b" and p.joules == pytest.approx(2 * LARGE.joules(100, 64, 1))


def test_separate_devices_and_spare_replicas() -> None:
    apart = {"small-1b": Site(1), "large-8b": Site(2)}
    pricing = Pricing(apart, RANK, MARGIN)
    assert pricing.price(SMALL, "small-1b", 100, 64, {"large-8b": 7}).note == "alone"
    # One of two replicas busy: the request goes to the idle one.
    assert pricing.price(LARGE, "large-8b", 100, 64, {"large-8b": 1}).note == "alone"
    assert pricing.price(LARGE, "large-8b", 100, 64, {"large-8b": 4}).note == \
        "joins a batch of 2"
    assert LARGE.joules(100, 64, math.inf) < LARGE.joules(100, 64, 8)


def test_auto_joins_the_busy_large_batch_and_says_why() -> None:
    actions = [ActionSpec("small", "small-1b", "direct"), ActionSpec("large", "large-8b", "direct")]
    quality = QualityTable({"chat": {"small:direct": 0.80, "large:direct": 0.82}})
    policy = Policy(actions, quality, ExpectedLengths(), {"small-1b": SMALL, "large-8b": LARGE},
                    ["small", "large"], 0.05, Caps(64, 192), SHARED, load=MARGIN)
    probs = {"chat": 1.0}
    idle = policy.choose(policy.candidates(probs, 100, None, {}), "balanced", None)
    assert idle.chosen.spec.key == "small:direct"
    busy = policy.choose(policy.candidates(probs, 100, None, {"large-8b": 7}), "balanced", None)
    assert busy.chosen.spec.key == "large:direct"
    assert busy.chosen.pricing == "joins a batch of 7"


SHARE = LoadPricing("share", colocation_penalty=0.0)


def test_share_pricing_charges_a_joining_request_its_share_of_the_batch_it_makes() -> None:
    p = Pricing(SHARED, RANK, SHARE).price(LARGE, "large-8b", 100, 64, {"large-8b": 7})
    assert p.note == "shares a batch of 8"
    assert p.joules == pytest.approx(LARGE.joules(100, 64, 8))
    # two replicas, seven running: the request's batch is 3.5 + 1
    two = {"large-8b": Site(2)}
    p = Pricing(two, RANK, SHARE).price(LARGE, "large-8b", 100, 64, {"large-8b": 7})
    assert p.joules == pytest.approx(LARGE.joules(100, 64, 4.5))
    # alone is alone under either pricing
    assert Pricing(SHARED, RANK, SHARE).price(LARGE, "large-8b", 100, 64, {}).joules == \
        pytest.approx(LARGE.joules(100, 64, 1))


def test_the_default_prices_short_prompts_at_the_margin_with_the_x2_penalty() -> None:
    """The share pricing mixed the models at eight clients and used 40% more
    than always-large on an H100 (router/pricing.py's table): the default
    (`prompt`) prices a short prompt as margin with the x2."""
    pricing = Pricing(SHARED, RANK)
    assert pricing.by_prompt
    assert pricing.price(LARGE, "large-8b", 100, 64, {"large-8b": 7}).joules == \
        pytest.approx(margin := Pricing(SHARED, RANK, MARGIN).price(
            LARGE, "large-8b", 100, 64, {"large-8b": 7}).joules)
    assert margin < LARGE.joules(100, 64, 8)
    assert pricing.price(SMALL, "small-1b", 100, 64, {"large-8b": 7}).joules == \
        pytest.approx(2 * SMALL.joules(100, 64, 1))


def test_the_colocation_penalty_is_a_setting() -> None:
    p = Pricing(SHARED, RANK, SHARE).price(SMALL, "small-1b", 100, 64, {"large-8b": 7})
    assert p.note == "beside large-8b" and p.joules == pytest.approx(SMALL.joules(100, 64, 1))
    half = LoadPricing("margin", colocation_penalty=0.5)
    p = Pricing(SHARED, RANK, half).price(SMALL, "small-1b", 100, 64, {"large-8b": 7})
    assert p.joules == pytest.approx(1.5 * SMALL.joules(100, 64, 1))


def test_share_pricing_keeps_easy_chat_on_the_small_model_beside_a_few_large_requests() -> None:
    """Four clients, three on the 8B: at the margin the 8B looks nearly free
    and takes the request; at its share of a batch of four the 1B is cheaper
    (the load-blind split that used 25.7% less at four clients, docs/routing.md)."""
    actions = [ActionSpec("small", "small-1b", "direct"), ActionSpec("large", "large-8b", "direct")]
    quality = QualityTable({"chat": {"small:direct": 0.80, "large:direct": 0.82}})

    def chosen(load: LoadPricing | None, running: dict[str, int]) -> str:
        policy = Policy(actions, quality, ExpectedLengths(),
                        {"small-1b": SMALL, "large-8b": LARGE}, ["small", "large"], 0.05,
                        Caps(64, 192), SHARED, load=load)
        cands = policy.candidates({"chat": 1.0}, 100, None, running)
        return policy.choose(cands, "balanced", None).chosen.spec.key

    assert chosen(MARGIN, {"large-8b": 3}) == "large:direct"
    assert chosen(None, {"large-8b": 3}) == "large:direct"  # margin is the default
    assert chosen(SHARE, {"large-8b": 3}) == "small:direct"
    assert chosen(SHARE, {}) == "small:direct"


def test_a_shared_batch_chosen_says_what_waking_the_other_model_was_priced_at() -> None:
    from router.engine import _waking_note
    from router.policy import Candidate

    small, large = ActionSpec("small", "small-1b", "direct"), ActionSpec("large", "large-8b",
                                                                          "direct")
    pricing = Pricing(SHARED, RANK, SHARE)
    running = {"large-8b": 7}
    cands = [Candidate(a, 0.8, p.joules, 64, p.note) for a, p in (
        (small, pricing.price(SMALL, "small-1b", 2000, 64, running)),
        (large, pricing.price(LARGE, "large-8b", 2000, 64, running)))]
    note = _waking_note(cands[1], cands)
    assert cands[1].pricing == "shares a batch of 8" and cands[0].pricing == "beside large-8b"
    assert note.startswith("; cheaper than waking small-1b beside it for small:direct at")


BY_PROMPT = LoadPricing("prompt", colocation_penalty=1.0)


def test_prompt_pricing_is_margin_for_short_prompts_and_share_for_long_ones() -> None:
    """The mixed-load grid (gpu-mixed-h100.json): beside a batch of short
    prompts the 1B cost up to ~2x what the curves say; with long prompts
    about what they say, and mixing the models saved."""
    by_prompt, margin = Pricing(SHARED, RANK, BY_PROMPT), Pricing(SHARED, RANK, MARGIN)
    share = Pricing(SHARED, RANK, LoadPricing("share", colocation_penalty=0.0))
    busy = {"large-8b": 7}
    for prompt, like in ((100, margin), (150, margin), (1000, share), (3000, share)):
        for curve, backend in ((LARGE, "large-8b"), (SMALL, "small-1b")):
            got, want = (p.price(curve, backend, prompt, 64, busy) for p in (by_prompt, like))
            assert got.joules == pytest.approx(want.joules) and got.note == want.note
    # halfway: halfway between the two prices, and half the penalty
    mid = 575
    join = by_prompt.price(LARGE, "large-8b", mid, 64, busy).joules
    assert join == pytest.approx((margin.price(LARGE, "large-8b", mid, 64, busy).joules
                                  + share.price(LARGE, "large-8b", mid, 64, busy).joules) / 2)
    beside = by_prompt.price(SMALL, "small-1b", mid, 64, busy)
    assert beside.note == "beside large-8b"
    assert beside.joules == pytest.approx(1.5 * SMALL.joules(mid, 64, 1))
    # alone is alone
    assert by_prompt.price(SMALL, "small-1b", 3000, 64, {}).joules == \
        pytest.approx(SMALL.joules(3000, 64, 1))


def test_a_batch_profile_makes_a_poorly_run_batch_dear_to_join_and_a_good_one_not() -> None:
    """The 8B's profile as closed loops on an H100 measured it, relative to
    one request alone (docs/routing.md, "The 8B between one and eight
    clients"): a batch of four costs 2.6x what the form says, eight what it
    says. With it, the default pricing sends a short prompt to the 1B beside
    three running 8B requests (joining them adds ~140 J, the 1B ~2 x 45), and
    still to the 8B beside seven."""
    from dataclasses import replace

    profiled = replace(LARGE, batch_profile=(
        (1.0, 1.0), (2.0, 1.75), (3.0, 2.07), (4.0, 2.6), (6.0, 1.52), (8.0, 1.0)))
    actions = [ActionSpec("small", "small-1b", "direct"), ActionSpec("large", "large-8b", "direct")]
    quality = QualityTable({"chat": {"small:direct": 0.80, "large:direct": 0.82}})

    def chosen(large: Curve, running: int) -> str:
        policy = Policy(actions, quality, ExpectedLengths(), {"small-1b": SMALL,
                        "large-8b": large}, ["small", "large"], 0.05, Caps(64, 192), SHARED)
        d = policy.choose(policy.candidates({"chat": 1.0}, 100, None, {"large-8b": running}),
                          "balanced", None)
        return d.chosen.spec.key

    assert chosen(LARGE, 3) == "large:direct"  # the form: joining costs its own work only
    assert chosen(profiled, 3) == "small:direct"
    assert chosen(profiled, 7) == "large:direct"
    joins = Pricing(SHARED, RANK).price(profiled, "large-8b", 100, 64, {"large-8b": 3})
    assert joins.note == "joins a batch of 3" and joins.joules > 2 * SMALL.joules(100, 64, 1)


def test_with_a_profile_a_join_is_priced_at_what_the_device_has_in_flight() -> None:
    """Three 8B requests and four on the 1B beside them: with a profile, the 8B
    is priced at a batch of seven (cheap to join), not at its three (dear): a
    dip in the 8B's count while some requests run small does not send more
    small (the c=8 replay with the 8B priced at its own count: +23% on
    always-large). Without a profile a join costs its own work at any count."""
    from dataclasses import replace

    profiled = replace(LARGE, batch_profile=(
        (1.0, 1.0), (2.0, 1.16), (3.0, 1.58), (4.0, 2.03), (6.0, 1.44), (8.0, 0.98)))
    pricing = Pricing(SHARED, RANK, MARGIN)
    alone = pricing.price(profiled, "large-8b", 100, 64, {"large-8b": 3})
    beside = pricing.price(profiled, "large-8b", 100, 64, {"large-8b": 3, "small-1b": 4})
    assert alone.note == beside.note == "joins a batch of 3"
    assert beside.joules == pytest.approx(profiled.joins(100, 64, 7))
    assert beside.joules < alone.joules
    assert pricing.price(LARGE, "large-8b", 100, 64, {"large-8b": 3, "small-1b": 4}).joules \
        == pytest.approx(LARGE.joins(100, 64, 3))


def test_a_pair_is_priced_at_its_share_without_the_penalty() -> None:
    """`share_at_most_in_flight`: with at most that many requests in flight on
    the device, whatever the batching, a request is priced at its share of
    the batch it makes and beside the lead without the penalty (two clients:
    the load-blind split 47% under always-large where the margin side of
    `prompt` was 4% under, H100; the default is 1). Beyond it, the batching
    as configured."""
    pairs = Pricing(SHARED, RANK)  # the default: prompt, pairs at their share
    plain = Pricing(SHARED, RANK, LoadPricing("prompt", 1.0, share_at_most_in_flight=0))
    one = {"large-8b": 1}
    join = pairs.price(LARGE, "large-8b", 100, 64, one)
    assert join.note == "shares a batch of 2"
    assert join.joules == pytest.approx(LARGE.joules(100, 64, 2))
    assert plain.price(LARGE, "large-8b", 100, 64, one).note == "joins a batch of 1"
    beside = pairs.price(SMALL, "small-1b", 100, 64, one)
    assert beside.note == "beside large-8b"
    assert beside.joules == pytest.approx(SMALL.joules(100, 64, 1))  # no x2
    assert plain.price(SMALL, "small-1b", 100, 64, one).joules == \
        pytest.approx(2 * SMALL.joules(100, 64, 1))
    # the device's count decides, its neighbours' requests included
    busy = {"large-8b": 1, "small-1b": 1}
    for curve, backend in ((LARGE, "large-8b"), (SMALL, "small-1b")):
        assert pairs.price(curve, backend, 100, 64, busy) == \
            plain.price(curve, backend, 100, 64, busy)
    # per replica: two replicas of the 8B with two in flight are two pairs
    two = {"large-8b": Site(2, frozenset({"small-1b"})), "small-1b": SHARED["small-1b"]}
    got = Pricing(two, RANK, LoadPricing("prompt", 1.0, share_at_most_in_flight=1)).price(
        LARGE, "large-8b", 100, 64, {"large-8b": 2})
    assert got.note == "shares a batch of 2" and got.joules == \
        pytest.approx(LARGE.joules(100, 64, 2))
    # alone is alone; and the margin pricing takes the rule too, share keeps its penalty
    assert pairs.price(SMALL, "small-1b", 100, 64, {}).note == "alone"
    margin = Pricing(SHARED, RANK, LoadPricing("margin", 1.0, share_at_most_in_flight=1))
    assert margin.price(SMALL, "small-1b", 100, 64, one).joules == \
        pytest.approx(SMALL.joules(100, 64, 1))
    share = Pricing(SHARED, RANK, LoadPricing("share", 0.5, share_at_most_in_flight=0))
    assert share.price(SMALL, "small-1b", 100, 64, one).joules == \
        pytest.approx(1.5 * SMALL.joules(100, 64, 1))


def test_two_clients_send_a_short_easy_prompt_small_beside_one_running_8b() -> None:
    """The decision the pair rule changes: one 8B request running, a short
    chat prompt that the 1B answers almost as well. Priced at the margin, the
    8B's join (its own work) undercuts the 1B's x2 beside it; priced as a
    pair, the 1B alone undercuts the 8B's share of two."""
    actions = [ActionSpec("small", "small-1b", "direct"), ActionSpec("large", "large-8b", "direct")]
    quality = QualityTable({"chat": {"small:direct": 0.80, "large:direct": 0.82}})

    def chosen(load: LoadPricing | None) -> str:
        policy = Policy(actions, quality, ExpectedLengths(), {"small-1b": SMALL,
                        "large-8b": LARGE}, ["small", "large"], 0.05, Caps(64, 192),
                        SHARED, load=load)
        d = policy.choose(policy.candidates({"chat": 1.0}, 100, None, {"large-8b": 1}),
                          "balanced", None)
        return d.chosen.spec.key

    assert chosen(None) == "small:direct"
    assert chosen(LoadPricing("prompt", 1.0, share_at_most_in_flight=0)) == "large:direct"
