"""Development datasets beyond MMLU-Pro, built from public per-question results into the registry's input layout
(the files and columns of shared/data/mmlu-pro: models.csv, questions.csv.gz, evaluations.csv.gz, splits.csv).

    python bench/devdata.py zeroeval --source /path/to/ZeroEval --out /work/devdata/zeroeval [--seed 0]

`zeroeval`: the public repository yuchenlin/ZeroEval (Apache-2.0), read from a local copy: a checkout, or a bare git
directory (read with `git show`). Its greedy outputs for GSM8K, MATH level 5 and CRUXEval (result_dirs/<task>/
<model>.json) are scored by the repository's own rules, reimplemented here (src/evaluation/math_eval.py for gsm and
math-l5, crux_eval.py for crux): the answer is read from the first JSON object of the output, else by key patterns,
else (Llama-3.1 models) from a trailing \\boxed{}; math compares the first numbers of both answers after light
cleaning, crux the answer strings exactly; an output with no answer counts as wrong. Model names are unified across
tasks the way the repository's summaries do. The per-model accuracies are checked against the repository's own
result_dirs/<task>.summary.json and printed; category = source = the task. The split is fixed, drawn by `--seed`
within each task (60/20/20: SPLIT).
"""
from __future__ import annotations

import argparse
import ast
import csv
import gzip
import hashlib
import json
import operator
import re
import subprocess
import sys
from pathlib import Path

TASKS = {"gsm": "gsm8k", "math-l5": "math-l5", "crux": "cruxeval"}
# the repository's summaries rename some outputs so that one model has one name across tasks (eval_utils.py)
RENAMES = (("gemma-2-9b-it@nvidia", "gemma-2-9b-it"), ("gemma-2-9b-it@together", "gemma-2-9b-it"),
           ("gemma-2-27b-it@together", "gemma-2-27b-it"), ("gemma-2-27b-it@nvidia", "gemma-2-27b-it"),
           ("deepseek-chat", "deepseek-v2-chat-0628"), ("deepseek-coder", "deepseek-v2-coder-0614"),
           ("DeepSeek-Coder-V2-0724", "deepseek-v2-coder-0724"),
           ("Llama-3.1-405B-Inst-fp8", "Llama-3.1-405B-Inst-fp8@together"),
           ("Llama-3.1-405B-Instruct-Turbo", "Llama-3.1-405B-Inst-fp8@together"),
           ("Meta-Llama-3.1-405B-Instruct@hyperbolic", "Llama-3.1-405B-Inst@hyperbolic"))
NUMBER = re.compile(r"-?\d+(\.\d+)?")
BOXED = re.compile(r"\\boxed{([\w\d]+)}")
NO_ANSWER = object()     # an output the rules read no answer from (a JSON null answer is an answer: "None")


def unified_name(name: str) -> str:
    for old, new in RENAMES:
        name = name.replace(old, new)
    return name


# ---- reading the answer out of an output (the repository's rules) ----

def first_json(s: str):
    """The first complete top-level {...} of s parsed (newlines dropped), None when it does not parse."""
    depth, start = 0, None
    for i, ch in enumerate(s):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                try:
                    return json.loads(s[start:i + 1].replace("\n", ""))
                except json.JSONDecodeError:
                    return None
    return None


def values_by_pattern(s: str, keys=("reasoning", "answer")) -> dict:
    """Key-by-key regular expressions for a JSON-like output that does not parse: quoted, broken quotes, unquoted."""
    out = {}
    for key in keys:
        m = re.search(f'"{key}"\\s*:\\s*"([^"]*?)"', s) or re.search(f'"{key}"\\s*:\\s*"(.*?)"', s, re.DOTALL)
        if not m:
            m = re.search(f'"{key}"\\s*:\\s*([^,\\s]*)', s) or re.search(f'{key}\\s*:\\s*([^,\\s]*)', s)
        if m:
            out[key] = m.group(1)
    return out


def extract_answer(file_model: str, output: str):
    """The model's answer (any JSON value) or NO_ANSWER when none can be read."""
    parsed = first_json(output)
    if not isinstance(parsed, dict) or "answer" not in parsed:
        parsed = values_by_pattern(output)
    if "answer" in parsed:
        return parsed["answer"]
    if "Llama-3.1" in file_model and "boxed" in output[-30:]:
        m = BOXED.search(output)
        if m and m.group(1):
            return m.group(1)
    return NO_ANSWER


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


def _arith(node):
    """Plain arithmetic only: the repository evaluates fractions with Python's eval, which must not run here."""
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left), _arith(node.right))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, exp = _arith(node.left), _arith(node.right)
        if abs(exp) > 64:
            raise ValueError("exponent too large")
        return base ** exp
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.operand))
    raise ValueError("not arithmetic")


def clean_math(answer: str) -> str:
    answer = answer.replace("$", "").strip().replace(",", "")
    if "/" in answer:
        try:
            answer = str(float(_arith(ast.parse(answer, mode="eval"))))
        except (SyntaxError, ValueError, TypeError, ZeroDivisionError, OverflowError, RecursionError):
            pass
    return answer


def math_correct(answer, truth: str) -> bool:
    if answer is NO_ANSWER:
        return False
    a = NUMBER.search(clean_math(str(answer)))
    t = NUMBER.search(clean_math(truth.replace("#", "").strip()))
    return bool(a and t) and float(a.group()) == float(t.group())


def crux_correct(answer, truth) -> bool:
    if answer is NO_ANSWER:
        return False
    a = str(answer).strip("'\"").replace("\n", "\\n")
    return a == str(truth).strip("'\"")


# ---- reading the repository ----

class Source:
    """A checkout or a bare git directory of the repository."""

    def __init__(self, path: Path, marker: str = "result_dirs"):
        self.path = Path(path)
        self.bare = not (self.path / marker).is_dir()     # a checkout has the marker folder; a bare copy has none
        if self.bare:
            self.commit = self._git("rev-parse", "HEAD").strip()
        else:
            try:
                self.commit = self._git("rev-parse", "HEAD").strip()
            except (subprocess.CalledProcessError, FileNotFoundError):
                self.commit = "unknown (not a git checkout)"

    def _git(self, *args) -> str:
        return subprocess.run(["git", "-C", str(self.path), *args], check=True, capture_output=True,
                              text=True).stdout

    def files(self, folder: str) -> list[str]:
        if not self.bare:
            return sorted(p.name for p in (self.path / folder).glob("*.json"))
        names = self._git("ls-tree", "--name-only", f"HEAD:{folder}").split()
        return sorted(n for n in names if n.endswith(".json"))

    def folders(self, folder: str) -> list[str]:
        if not self.bare:
            return sorted(p.name for p in (self.path / folder).iterdir() if p.is_dir())
        rows = self._git("ls-tree", f"HEAD:{folder}").splitlines()
        return sorted(r.split("\t", 1)[1] for r in rows if r.split()[1] == "tree")

    def read(self, rel: str) -> str:
        if not self.bare:
            return (self.path / rel).read_text(encoding="utf-8")
        return self._git("show", f"HEAD:{rel}")


def question_text(item: dict) -> str:
    return str(item.get("question") or item.get("problem") or "").strip()


def score_task(src: Source, task: str):
    """{question_id: (text, truth)}, {model: {question_id: 0/1}}, the published accuracy per model and
    {model: {question_id: (prompt characters, output characters)}}."""
    questions, results, lengths = {}, {}, {}
    for fname in src.files(f"result_dirs/{task}"):
        file_model = fname[:-len(".json")]
        model = unified_name(file_model)
        if model in results:
            raise SystemExit(f"{task}: two output files are model {model}")
        try:
            items = json.loads(src.read(f"result_dirs/{task}/{fname}"))
        except subprocess.CalledProcessError:
            print(f"{task}/{fname}: absent from this copy (a large blob left out), skipped", file=sys.stderr)
            continue
        rows, sizes = {}, {}
        for item in items:
            qid = f"{TASKS[task]}/{item['id']}"
            truth = str(item["answer"])
            text = question_text(item)
            if qid not in questions:
                questions[qid] = (text, truth)
            elif questions[qid][1] != truth:
                raise SystemExit(f"{task}: {qid} has two right answers ({file_model})")
            output = item["output"][0] if item.get("output") else ""
            answer = extract_answer(file_model, output)
            ok = crux_correct(answer, truth) if task == "crux" else math_correct(answer, truth)
            rows[qid] = int(ok)
            sizes[qid] = (len(item.get("model_input") or text), len(output))
        results[model], lengths[model] = rows, sizes
    try:
        published = {r["Model"]: float(r["Acc"]) for r in json.loads(src.read(f"result_dirs/{task}.summary.json"))
                     if r.get("Mode", "greedy") == "greedy"}
    except (subprocess.CalledProcessError, FileNotFoundError, ValueError, KeyError):
        published = {}
    return questions, results, published, lengths


CHARS_PER_TOKEN = 4      # OpenAI's rule of thumb for English text; the outputs' own tokenizers are not at hand


def read_prices(path: Path) -> dict[str, tuple[float, float, str]]:
    """model -> (input $ per million tokens, output $ per million tokens, source), from a CSV like
    bench/zeroeval_prices.csv."""
    with open(path, newline="", encoding="utf-8") as f:
        return {r["model"]: (float(r["input_usd_per_mtok"]), float(r["output_usd_per_mtok"]), r["source"])
                for r in csv.DictReader(f)}


def cost_per_query(sizes: dict, price: tuple[float, float, str]) -> float:
    """The model's mean $ per question: its prompt and output lengths in tokens (characters / CHARS_PER_TOKEN) at
    its list prices."""
    per = [(p * price[0] + o * price[1]) / CHARS_PER_TOKEN / 1e6 for p, o in sizes.values()]
    return sum(per) / len(per)


SPLIT = (0.6, 0.2, 0.2)
FOLDS = 5
SPLIT_TEXT = "/".join(str(round(100 * f)) for f in SPLIT)


def split_of(questions: dict, seed: int, fractions: tuple = SPLIT, fold: int | None = None) -> dict:
    """train/val/test fractions within each task (60/20/20: a dev dataset has a few thousand questions at most, and a
    val split of 10% could not tell the routing policies apart), drawn by seed (the order of ids fixed first, so the
    draw is the same anywhere).

    `fold` (0..FOLDS-1, 60/20/20 only): five-fold cross-validation over the same draw. Each task's permuted questions
    fall in five blocks; fold F tests on block F, validates on block F-1 and trains on the other three, so that over
    the five folds every question is tested once (a pooled test five times the size). Fold 4 is the plain split."""
    import numpy as np

    if fold is not None and (tuple(fractions) != SPLIT or not 0 <= fold < FOLDS):
        raise ValueError(f"fold must be 0..{FOLDS - 1}, with the {SPLIT_TEXT} split")
    rng = np.random.default_rng(seed)
    out, by_task = {}, {}
    for qid in sorted(questions):
        by_task.setdefault(qid.split("/", 1)[0], []).append(qid)
    for task in sorted(by_task):
        ids = by_task[task]
        order = rng.permutation(len(ids))
        n_tr, n_va = int(round(fractions[0] * len(ids))), int(round(fractions[1] * len(ids)))
        # block edges: the plain split's train part in three, then its val and its test
        edges = [int(round(f * len(ids))) for f in (0.2, 0.4)] + [n_tr, n_tr + n_va]
        base = ("train", "train", "train", "val", "test")
        for rank, i in enumerate(order):
            if fold is None:
                out[ids[i]] = "train" if rank < n_tr else "val" if rank < n_tr + n_va else "test"
            else:
                block = int(np.searchsorted(edges, rank, side="right"))
                out[ids[i]] = base[(block - fold - 1) % FOLDS]
    return out


def provider_of(model: str) -> str:
    low = model.lower()
    for key, who in (("gpt", "openai"), ("o1-", "openai"), ("claude", "anthropic"), ("gemini", "google"),
                     ("gemma", "google"), ("llama", "meta"), ("qwen", "alibaba"), ("yi-", "01-ai"),
                     ("deepseek", "deepseek"), ("mistral", "mistral"), ("mixtral", "mistral"), ("phi-", "microsoft"),
                     ("command-r", "cohere"), ("reka", "reka"), ("athene", "nexusflow")):
        if key in low:
            return who
    return ""


def family_of(model: str) -> str:
    """The base the model belongs to: its name without serving provider, date or size suffixes (a rough rule)."""
    name = model.split("@")[0].lower()
    name = re.sub(r"-(\d{4}-\d{2}-\d{2}|\d{8}|\d{4}|\d{2}-\d{2}-\d{2})$", "", name)
    name = re.sub(r"-(inst|instruct|chat|it|fp8|turbo|preview|exp|latest|v0\.\d|4k)(?=-|$)", "", name)
    return re.sub(r"-+", "-", name).strip("-")


def zeroeval(source: Path, out: Path, seed: int, prices: Path | None = None, fold: int | None = None,
             tasks: list[str] | None = None) -> dict:
    """`tasks`: some of TASKS only (`--tasks gsm`: GSM8K alone, where frontier models are right about 95% of the
    time: a copy on which the best single model is near the ceiling)."""
    src = Source(source)
    questions, evals, report, sizes = {}, {}, {}, {}
    for task in tasks or TASKS:
        qs, results, published, lengths = score_task(src, task)
        questions.update({q: (t, a, TASKS[task]) for q, (t, a) in qs.items()})
        for model, rows in results.items():
            evals.setdefault(model, {}).update(rows)
            sizes.setdefault(model, {}).update(lengths[model])
            acc = 100.0 * sum(rows.values()) / max(len(rows), 1)
            report.setdefault(task, []).append((model, len(rows), round(acc, 2), published.get(model)))
    splits = split_of(questions, seed, fold=fold)
    price = read_prices(prices) if prices else {}
    unknown = sorted(set(price) - set(evals))
    if unknown:
        raise SystemExit(f"{prices}: no results for {', '.join(unknown)}")
    # a routed choice is scored only where the model has a result: only models that answered every question get a
    # price, so that a cost frontier is not decided by gaps in the data
    gaps = sorted(m for m in price if len(evals[m]) < len(questions))
    for m in gaps:
        print(f"{m}: results for {len(evals[m])} of {len(questions)} questions, left unpriced", file=sys.stderr)
    cost = {m: cost_per_query(sizes[m], price[m]) for m in price if m not in gaps}
    rows = [[m, family_of(m), provider_of(m)] + ([f"{cost[m]:.8f}" if m in cost else ""] if price else [])
            for m in sorted(evals)]
    n_evals = write_layout(out, rows, ["model", "family", "provider"] + (["cost"] if price else []),
                           questions, evals, splits)
    _copy_licence(src, out)
    checks = {task: {"models": len(rows), "matched": sum(1 for r in rows if r[3] is not None and abs(r[2] - r[3])
                                                         < 0.006),
                     "max_gap": max((abs(r[2] - r[3]) for r in rows if r[3] is not None), default=None)}
              for task, rows in report.items()}
    summary = {"commit": src.commit, "models": len(evals), "questions": len(questions), "evaluations": n_evals,
               "splits": {s: sum(1 for v in splits.values() if v == s) for s in ("train", "val", "test")},
               "seed": seed, "fold": fold, "published_check": checks,
               "priced": {m: round(c, 8) for m, c in sorted(cost.items(), key=lambda x: x[1])}}
    readme = [f"# ZeroEval per-question results of {len(evals)} models", "",
              f"Built by bench/devdata.py from yuchenlin/ZeroEval at commit {src.commit} (Apache-2.0, LICENSE "
              "beside this file): greedy outputs for GSM8K, MATH level 5 and CRUXEval, scored by the repository's "
              "rules (reimplemented). category = source = the task.", "",
              f"{len(questions)} questions, {n_evals} evaluations; split seed {seed} ({SPLIT_TEXT} within each task).",
              "", "| task | model | questions | accuracy | published |", "|---|---|---|---|---|"]
    for task, rows in report.items():
        readme += [f"| {task} | {m} | {n} | {a:.2f} | {'' if p is None else f'{p:.2f}'} |" for m, n, a, p in rows]
    if price:
        readme += ["", f"`cost` in models.csv: the model's mean $ per question, its prompt and output lengths in "
                   f"tokens (characters / {CHARS_PER_TOKEN}) at list prices ({prices.name}), for the models that "
                   f"answered every question ({len(cost)}; left unpriced for gaps: {', '.join(gaps) or 'none'}).", "", "| model | $ per question | input, output $ per M tokens | source |",
                   "|---|---|---|---|"]
        readme += [f"| {m} | {cost[m]:.6f} | {price[m][0]}, {price[m][1]} | {price[m][2]} |"
                   for m in sorted(cost, key=cost.get)]
    (out / "README.md").write_text("\n".join(readme) + "\n", encoding="utf-8")
    return summary


# ---- AlpacaEval 2.0 ----

AE_ANNOTATOR = "weighted_alpaca_eval_gpt4_turbo"     # AlpacaEval 2.0's judge
AE_BASELINE = "gpt4_1106_preview"                     # the outputs it compares every model's with
AE_FAMILY = {"gpt35": "gpt-3.5", "gpt": "gpt-3.5", "gpt4": "gpt-4", "text": "davinci", "oasst": "oasst",
             "claude": "claude"}


def ae_family(model: str) -> str:
    """A naming rule: the name's first word (FuseChat-*, vicuna-*, openbuddy-*, alpaca-*...), a few merged."""
    head = re.split(r"[-_]", model.lower(), maxsplit=1)[0]
    if model.lower().startswith("gpt4"):
        return "gpt-4"
    return AE_FAMILY.get(head, head)


def alpacaeval(source: Path, out: Path, seed: int, fold: int | None = None) -> dict:
    """tatsu-lab/alpaca_eval's per-instruction judgements (results/<model>/<AE_ANNOTATOR>/annotations.json): 1
    where the judge prefers the model's output to the baseline's (preference above 1.5), else 0; category = source
    = the instruction's subset (helpful_base, koala, oasst, selfinstruct, vicuna)."""
    src = Source(source, marker="results")
    questions, evals, skipped = {}, {}, []
    published = _ae_published(src)
    adversarial = []
    for model in src.folders("results"):
        if model == AE_BASELINE:                 # judged against itself: every judgement a tie
            continue
        if _ae_adversarial(src, model):          # a fixed output made to fool the judge: nothing to route to
            adversarial.append(model)
            continue
        rel = f"results/{model}/{AE_ANNOTATOR}/annotations.json"
        try:
            items = json.loads(src.read(rel))
        except (subprocess.CalledProcessError, FileNotFoundError, NotADirectoryError):
            skipped.append(model)                # no such judgement, or a large blob absent from this copy
            continue
        rows = {}
        for item in items:
            text = str(item["instruction"]).strip()
            qid = f"{item['dataset']}/{hashlib.sha1(text.encode()).hexdigest()[:12]}"
            questions.setdefault(qid, (text, "", item["dataset"]))
            pref = item.get("preference")
            rows[qid] = int(pref is not None and float(pref) > 1.5)
        evals[model] = rows
    print(f"{len(skipped)} models without a readable {AE_ANNOTATOR} judgement skipped; left out as adversarial by "
          f"the repository: {', '.join(adversarial) or 'none'}", file=sys.stderr)
    splits = split_of(questions, seed, fold=fold)
    write_layout(out, [[m, ae_family(m), ""] for m in sorted(evals)], ["model", "family", "provider"],
                 questions, evals, splits)
    _copy_licence(src, out)
    check = {m: (round(100.0 * sum(r.values()) / len(r), 2), published.get(m)) for m, r in evals.items()}
    gaps = [abs(a - p) for a, p in check.values() if p is not None]
    summary = {"commit": src.commit, "models": len(evals), "skipped": len(skipped), "adversarial": adversarial,
               "questions": len(questions),
               "evaluations": sum(len(r) for r in evals.values()), "seed": seed, "fold": fold,
               "splits": {k: sum(1 for v in splits.values() if v == k) for k in ("train", "val", "test")},
               "published_check": {"models": len(gaps), "within_0.5": sum(g <= 0.5 for g in gaps),
                                   "max_gap": max(gaps, default=None)}}
    readme = [f"# AlpacaEval 2.0 per-instruction judgements of {len(evals)} models", "",
              f"Built by bench/devdata.py from tatsu-lab/alpaca_eval at commit {src.commit} (Apache-2.0, LICENSE "
              f"beside this file): {AE_ANNOTATOR}'s preference for each model's output over gpt4_1106_preview's, "
              "1 above 1.5; category = source = the instruction's subset.", "",
              "| model | win rate here | published discrete win rate |", "|---|---|---|"]
    readme += [f"| {m} | {a:.2f} | {'' if p is None else f'{p:.2f}'} |" for m, (a, p) in sorted(check.items())]
    (out / "README.md").write_text("\n".join(readme) + "\n", encoding="utf-8")
    return summary


def _ae_adversarial(src: Source, model: str) -> bool:
    """Whether the repository names the model adversarial (its configs.yaml pretty_name: "NullModel (adversarial)",
    "GPT-4 (Adversarial)"): outputs written to game the judge, which win judgements and answer nothing."""
    try:
        config = src.read(f"src/alpaca_eval/models_configs/{model}/configs.yaml")
    except (subprocess.CalledProcessError, FileNotFoundError, NotADirectoryError):
        return False
    names = re.findall(r"^\s*pretty_name:\s*(.+)$", config, flags=re.MULTILINE)
    return any("adversarial" in n.lower() for n in names)


def _ae_published(src: Source) -> dict[str, float]:
    rel = f"src/alpaca_eval/leaderboards/data_AlpacaEval_2/{AE_ANNOTATOR}_leaderboard.csv"
    try:
        rows = csv.DictReader(src.read(rel).splitlines())
        return {r[""]: float(r["discrete_win_rate"]) for r in rows if r.get("discrete_win_rate")}
    except (subprocess.CalledProcessError, FileNotFoundError, KeyError, ValueError):
        return {}


def write_layout(out: Path, model_rows: list[list], model_header: list[str], questions: dict, evals: dict,
                 splits: dict) -> int:
    """The registry's input layout in `out`: questions {id: (text, answer, category)}, evals {model: {id: 0/1}}
    -> the number of evaluations written."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "models.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(model_header)
        w.writerows(model_rows)
    with gzip.open(out / "questions.csv.gz", "wt", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["question_id", "category", "source", "question", "options", "answer"])
        for qid in sorted(questions):
            text, truth, task = questions[qid]
            w.writerow([qid, task, task, text, "", truth])
    n_evals = 0
    with gzip.open(out / "evaluations.csv.gz", "wt", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["model", "question_id", "correct"])
        for model in sorted(evals):
            for qid in sorted(evals[model]):
                w.writerow([model, qid, evals[model][qid]])
                n_evals += 1
    with open(out / "splits.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["question_id", "split"])
        for qid in sorted(splits):
            w.writerow([qid, splits[qid]])
    return n_evals


def _copy_licence(src: Source, out: Path) -> None:
    try:
        (out / "LICENSE").write_text(src.read("LICENSE"), encoding="utf-8")
    except (subprocess.CalledProcessError, FileNotFoundError):
        pass


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    z = sub.add_parser("zeroeval", help="GSM8K, MATH level 5 and CRUXEval outputs of yuchenlin/ZeroEval")
    z.add_argument("--source", required=True, type=Path, help="a copy of the repository (checkout or bare git dir)")
    z.add_argument("--out", required=True, type=Path, help="the folder to write (outside the repository)")
    z.add_argument("--seed", type=int, default=0)
    a = sub.add_parser("alpacaeval", help="AlpacaEval 2.0 judgements of tatsu-lab/alpaca_eval's models")
    a.add_argument("--source", required=True, type=Path, help="a copy of the repository (checkout or bare git dir)")
    a.add_argument("--out", required=True, type=Path, help="the folder to write (outside the repository)")
    a.add_argument("--seed", type=int, default=0)
    for p in (z, a):
        p.add_argument("--fold", type=int, choices=range(FOLDS), help="five-fold cross-validation: test on block F "
                       "of the seed's draw, validate on block F-1 (fold 4 is the plain split; see split_of)")
    z.add_argument("--tasks", nargs="+", choices=sorted(TASKS), help="only these tasks (default: all three)")
    z.add_argument("--prices", type=Path, help="list prices per model (CSV like bench/zeroeval_prices.csv): adds a "
                   "`cost` column, the mean $ per question")
    args = ap.parse_args(argv)
    if not args.source.exists():
        raise SystemExit(f"--source {args.source}: no such folder")
    if args.cmd == "alpacaeval":
        print(json.dumps(alpacaeval(args.source, args.out, args.seed, args.fold), indent=1))
    else:
        print(json.dumps(zeroeval(args.source, args.out, args.seed, args.prices, args.fold, args.tasks), indent=1))


if __name__ == "__main__":
    sys.exit(main())
