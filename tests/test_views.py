"""The per-token teaching views (views.TokenViews records them, plots.py draws them): from a hand-made run folder,
and from a short run of the trainer."""
import json
import os
from types import SimpleNamespace

import torch

import gae
from machinery import plots
import vapo
from machinery import views as views_mod


def hand_made_record(rng: torch.Generator) -> dict:
    """Four probes (two right, two wrong, of different lengths) whose rows are gae.py's on random values."""
    probes = []
    for reward, length in ((1.0, 5), (1.0, 40), (-1.0, 3), (-1.0, 25)):
        values = torch.randn(1, length, generator=rng) * 0.3  # [1, T]
        mask = torch.ones(1, length, dtype=torch.long)
        rewards = gae.terminal_rewards(torch.tensor([reward]), mask)
        lam = gae.length_adaptive_lambda(torch.tensor([length]), 0.05)
        adaptive, returns = gae.decoupled_gae(rewards, values, mask, lam_policy=lam, lam_critic=1.0)
        row = {"value": values, "return": returns, "adv_adaptive": adaptive,
               "adv_0.95": gae.gae(rewards, values, mask, lam=0.95)[0], "adv_1.0": gae.gae(rewards, values, mask, lam=1.0)[0],
               "ratio": 1 + 0.4 * torch.randn(1, length, generator=rng), "entropy": torch.rand(1, length, generator=rng)}
        probes.append({"reward": reward, "length": length, "lam_policy": float(lam), "prompt": "1+2=",
                       "tokens": list(range(length)), "pieces": [f"t{t}" for t in range(length)],
                       **{k: v[0].tolist() for k, v in row.items()}})
    counts = [sum(p["length"] > t for p in probes) for t in range(40)]
    return {"step": 3, "stage": "evaluation", "eps_low": 0.2, "eps_high": 0.28, "lam_critic": 1.0, "alpha": 0.05,
            "probes": probes, "by_position": {
                "mean_value": [sum(p["value"][t] for p in probes if p["length"] > t) / c for t, c in enumerate(counts)],
                "mean_return": [sum(p["reward"] for p in probes if p["length"] > t) / c for t, c in enumerate(counts)],
                "count": counts}}


def test_views_from_a_hand_made_run_folder(tmp_path):
    """plots.py tokens RUN_DIR draws, for the shortest and longest right and wrong probe, the rows asked for:
    V(s_t) and the return target, the advantage under the length-adaptive lambda, 0.95 and 1.0 (equal to gae.py's
    output for those tokens), the ratio with the clip bounds and the tokens where they bit, the entropy; then the
    value-by-position figure and the HTML page of tokens coloured by advantage."""
    record = hand_made_record(torch.Generator().manual_seed(0))
    (tmp_path / "tokens.jsonl").write_text(json.dumps(record) + "\n" + '{"step": 4, "stage": "eval')  # a cut line
    folder = plots.plot_tokens(str(tmp_path))
    assert folder == str(tmp_path / "views" / "step-3")
    assert sorted(os.listdir(folder)) == ["index.html", "probe-0.png", "probe-1.png", "probe-2.png", "probe-3.png",
                                          "value-by-position.png"]
    assert plots.pick_probes(record["probes"]) == [0, 1, 2, 3]
    for probe in record["probes"]:
        drawn = plots.probe_figure(record, probe, str(tmp_path / "one.png"))
        assert set(drawn) == {"critic: V(s_t) and its return target", "policy advantage, raw (before whitening)",
                              "ratio pi_new / pi_old of the step's update", "entropy"}
        advantages = drawn["policy advantage, raw (before whitening)"]
        n = probe["length"]
        values, mask = torch.tensor([probe["value"]]), torch.ones(1, n, dtype=torch.long)
        rewards = gae.terminal_rewards(torch.tensor([probe["reward"]]), mask)
        for label, lam in (("lambda 0.95", 0.95), ("lambda 1.0", 1.0)):
            expected = gae.gae(rewards, values, mask, lam=lam)[0][0]
            torch.testing.assert_close(torch.tensor(advantages[label]), expected)
        adaptive = next(v for k, v in advantages.items() if k.startswith("length-adaptive"))
        lam = gae.length_adaptive_lambda(torch.tensor([n]), 0.05)
        torch.testing.assert_close(torch.tensor(adaptive), gae.decoupled_gae(rewards, values, mask, lam_policy=lam,
                                                                             lam_critic=1.0)[0][0])
        ratio, a = probe["ratio"], probe["adv_adaptive"]
        bit = drawn["ratio pi_new / pi_old of the step's update"]["clip bit"]
        assert bit == [t for t in range(n) if (a[t] > 0 and ratio[t] > 1.28) or (a[t] < 0 and ratio[t] < 0.8)]
    assert any(plots.probe_figure(record, p, str(tmp_path / "one.png"))["ratio pi_new / pi_old of the step's update"]
               ["clip bit"] for p in record["probes"])  # the random ratios do cross the bounds somewhere
    page = (tmp_path / "views" / "step-3" / "index.html").read_text()
    assert page.count("<span") == sum(p["length"] for p in record["probes"]) and "rgba(0,160,0" in page


def test_a_run_records_the_views_at_step_0_after_pretraining_and_at_each_evaluation(tiny_model_dir, tmp_path):
    """A short run writes a record at step 0, after value pretraining and at each evaluation, over the same probe
    responses. Each record's advantage and return rows are gae.py's on the record's own values and rewards; the
    ratio is 1 where no update has happened yet and moves after one; the value-by-position curve is the mean of
    the probes' values; and a resume drops the records after its checkpoint."""
    cfg = vapo.Config(model=tiny_model_dir, dataset="builtin", steps=2, prompts_per_step=2, samples_per_prompt=2,
                      mini_batch_size=4, micro_batch_size=2, max_new_tokens=16, actor_lr=1e-2, critic_lr=1e-3,
                      warmup_steps=0, value_pretrain_steps=1, eval_every=1, eval_prompts=4, eval_samples=1,
                      save_every=1, alpha=0.5, output_dir=str(tmp_path / "run")).validate()
    vapo.train(cfg)
    records = plots.read_tokens(cfg.output_dir)
    assert [(r["step"], r["stage"]) for r in records] == [(0, "step 0"), (0, "after value pretraining"),
                                                          (1, "evaluation"), (2, "evaluation")]
    assert len({json.dumps([p.get("tokens") for p in r["probes"]]) for r in records}) == 1  # the same probes
    assert len(records[0]["probes"]) == 4 * views_mod.PROBE_SAMPLES
    for r in records:
        drawn = [p for p in r["probes"] if "value" in p]  # token by token for the four drawn only
        assert [r["probes"].index(p) for p in drawn] == plots.pick_probes(r["probes"]) and len(drawn) >= 2
        for p in drawn:
            n = p["length"]
            values, mask = torch.tensor([p["value"]]), torch.ones(1, n, dtype=torch.long)
            rewards = gae.terminal_rewards(torch.tensor([p["reward"]]), mask)
            lam = gae.length_adaptive_lambda(torch.tensor([n]), cfg.alpha)
            adaptive, returns = gae.decoupled_gae(rewards, values, mask, lam_policy=lam, lam_critic=cfg.lam_critic)
            for key, expected in (("adv_adaptive", adaptive), ("return", returns),
                                  ("adv_0.95", gae.gae(rewards, values, mask, lam=0.95)[0]),
                                  ("adv_1.0", gae.gae(rewards, values, mask, lam=1.0)[0])):
                torch.testing.assert_close(torch.tensor([p[key]]), expected, atol=2e-6, rtol=1e-5)
        by = r["by_position"]  # over all the probes: the counts are theirs, the mean return of +-1 rewards
        assert by["count"][0] == len(r["probes"]) and by["count"] == [sum(p["length"] > t for p in r["probes"])
                                                                     for t in range(len(by["count"]))]
        assert by["mean_return"][0] == sum(p["reward"] for p in r["probes"]) / len(r["probes"])
        assert all(-1 <= v <= 1 for v in by["mean_return"])
    assert all(x == 1.0 for r in records[:2] for p in r["probes"] for x in p.get("ratio", []))  # no update yet
    assert any(abs(x - 1) > 1e-4 for p in records[2]["probes"] for x in p.get("ratio", []))  # step 1's update
    assert os.path.exists(os.path.join(cfg.output_dir, "views", "step-0-pretrained", "probe-0.png"))
    assert os.path.exists(os.path.join(cfg.output_dir, "views", "step-2", "index.html"))

    class FakeRun(SimpleNamespace):  # a class: TokenViews holds its run by a weak reference
        pass
    fake = FakeRun(cfg=cfg, dir=cfg.output_dir)
    views = views_mod.TokenViews(fake)
    views.truncate(1)  # what Run.restore does on a resume from a step-1 checkpoint
    assert [(r["step"], r["stage"]) for r in plots.read_tokens(cfg.output_dir)] == [
        (0, "step 0"), (0, "after value pretraining"), (1, "evaluation")]
    views.truncate(0, value_pretrained=False, pretrain_step=1)  # killed after pretraining, before it was marked
    assert [(r["step"], r["stage"]) for r in plots.read_tokens(cfg.output_dir)] == [(0, "step 0")]
    views.truncate(0, value_pretrained=False, pretrain_step=0)  # from the beginning: nothing is kept
    assert plots.read_tokens(cfg.output_dir) == []


def test_the_views_mark_where_a_wrong_response_first_goes_wrong(tmp_path, tiny_model_dir):
    """#30: the task knows every correct step, so a wrong probe's record names its first wrong token
    (task.first_error), and its figure and the page mark it."""
    record = hand_made_record(torch.Generator().manual_seed(0))
    record["probes"][0]["first_error"] = 2
    drawn = plots.probe_figure(record, record["probes"][0], str(tmp_path / "one.png"))
    assert drawn["first wrong token"] == 2
    assert "first wrong token" not in plots.probe_figure(record, record["probes"][1], str(tmp_path / "two.png"))
    page = plots.tokens_html(record, [0, 1])
    assert page.count("outline:2px solid purple") == 1 and "first wrong token: t=2" in page
    cfg = vapo.Config(model=tiny_model_dir, dataset="builtin", steps=1, prompts_per_step=2, samples_per_prompt=2,
                      mini_batch_size=4, micro_batch_size=2, max_new_tokens=16, value_pretrain_steps=0,
                      eval_every=0, eval_prompts=4, eval_samples=1, save_every=0,
                      output_dir=str(tmp_path / "run")).validate()
    vapo.train(cfg)
    drawn = [p for r in plots.read_tokens(cfg.output_dir) for p in r["probes"] if "pieces" in p]
    assert drawn and all(("first_error" in p) == (p["reward"] < 0) for p in drawn)  # a random model: all wrong
    assert all(0 <= p["first_error"] < p["length"] for p in drawn if "first_error" in p)
