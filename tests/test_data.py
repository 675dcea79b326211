"""data.py: local JSONL / Parquet files, field mappings and presets, templates, malformed rows, offline hub names,
GSM8K-form answers outside the GSM8K preset. Nothing is downloaded: hub datasets are replaced by a stand-in
`datasets` module."""
import json
import logging
import re
import sys
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from machinery.data import DAPO_PREFIX, DAPO_SUFFIX, format_prompt, gsm8k_answer, gsm8k_final_answer, load_prompts
from machinery.task import build_tokenizer


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def fake_datasets(monkeypatch, rows=None, error=None):
    """Install a stand-in `datasets` module; returns the list of load_dataset calls it received."""
    calls = []

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        if error is not None:
            raise error
        return rows

    monkeypatch.setitem(sys.modules, "datasets", SimpleNamespace(load_dataset=load_dataset))
    return calls


def test_jsonl_with_field_mapping(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"q": "What is 2+3?", "a": 5}, {"q": "Name x.", "a": " x "}])
    rows = load_prompts(path, question_field="q", answer_field="a", template="raw")
    assert rows == [{"prompt": "What is 2+3?", "question": "What is 2+3?", "answer": "5"},
                    {"prompt": "Name x.", "question": "Name x.", "answer": "x"}]
    assert len(load_prompts(path, question_field="q", answer_field="a", limit=1)) == 1


def test_parquet_with_nested_fields(tmp_path):
    table = pa.table({"problem": ["1+1?", "2*3?", "10/4?"],
                      "meta": [{"gold": "2"}, {"gold": "6"}, {"gold": "2.5"}]})
    pq.write_table(table, tmp_path / "p.parquet")
    rows = load_prompts(str(tmp_path / "p.parquet"), question_field="problem", answer_field="meta.gold")
    assert [r["answer"] for r in rows] == ["2", "6", "2.5"]
    assert rows[1]["prompt"] == format_prompt("2*3?", "base") and rows[1]["question"] == "2*3?"


def test_default_fields_and_float_answer(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"question": "half of 5?", "answer": 2.5}, ""])  # blank line: no row
    assert load_prompts(path, template="raw") == [{"prompt": "half of 5?", "question": "half of 5?", "answer": "2.5"}]


def test_gsm8k_answer():
    assert gsm8k_answer("She pays 3 * 400 = 1,200 dollars.\n#### 1,200") == "1200"
    assert gsm8k_answer("#### -7") == "-7"
    with pytest.raises(ValueError, match="####"):
        gsm8k_answer("no marker 12")


def test_templates():
    question = "What is 6*7?"
    base = format_prompt(question, "base")
    assert question in base and "Answer:" in base and base.startswith("Solve the following math problem")
    assert base == DAPO_PREFIX + question + DAPO_SUFFIX
    assert format_prompt(question, "raw") == question
    tok = build_tokenizer()  # a fresh one: the session fixture stays untouched
    with pytest.raises(ValueError, match="chat template"):
        format_prompt(question, "chat", tok)
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    assert format_prompt(question, "chat", tok) == f"<user>{base}</user><assistant>"
    # chat-brief: the question and one line of instruction
    assert format_prompt(question, "chat-brief", tok) == (f"<user>{question}\nEnd your reply with a line 'Answer: "
                                                          "<your answer>'.</user><assistant>")
    with pytest.raises(ValueError, match="unknown template"):
        format_prompt(question, "fancy")


@pytest.mark.parametrize("lines, where, cause", [
    (['{"question": "ok", "answer": "1"}', "", '{"question": "broken", '], "line 3", "not valid JSON"),
    (['{"question": "ok", "answer": "1"}', '{"question": "no answer"}'], "line 2", "missing field 'answer'"),
    (['{"question": "   ", "answer": "1"}'], "line 1", "empty question"),
    (['{"question": "q", "answer": null}'], "line 1", "not a string or a number"),
    (['{"question": "q", "answer": [1, 2]}'], "line 1", "not a string or a number"),
    (['{"question": "q", "answer": true}'], "line 1", "not a string or a number"),
    (['{"question": 12, "answer": "1"}'], "line 1", "not a string"),
    (['["question", "answer"]'], "line 1", "missing field"),
])
def test_malformed_jsonl_rows(tmp_path, lines, where, cause):
    path = write_jsonl(tmp_path / "bad.jsonl", lines)
    with pytest.raises(ValueError, match="bad.jsonl") as info:
        load_prompts(path)
    assert where in str(info.value) and cause in str(info.value)


def test_malformed_parquet_row(tmp_path):
    pq.write_table(pa.table({"question": ["a", None], "answer": ["1", "2"]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"bad\.parquet, row 2"):
        load_prompts(str(tmp_path / "bad.parquet"))


def test_missing_file_and_unknown_extension(tmp_path):
    for name in ("nope.jsonl", "nope.parquet", "nope.JSONL"):
        with pytest.raises(FileNotFoundError, match=rf"^{tmp_path / name}: no such file$"):
            load_prompts(str(tmp_path / name))
    (tmp_path / "p.txt").write_text("x")
    accepted = r"\(expected a local \.jsonl or \.parquet file, or a Hugging Face dataset name\)"
    with pytest.raises(FileNotFoundError, match=rf"p\.txt: not a \.jsonl or \.parquet file {accepted}"):
        load_prompts(str(tmp_path / "p.txt"))
    with pytest.raises(FileNotFoundError, match=rf"nope\.json: not a \.jsonl or \.parquet file {accepted}"):
        load_prompts(str(tmp_path / "nope.json"))
    (tmp_path / "dir.jsonl").mkdir()
    for directory in (tmp_path, tmp_path / "dir.jsonl"):
        with pytest.raises(FileNotFoundError, match=rf"^{directory}: a directory, not a \.jsonl .*{accepted}"):
            load_prompts(str(directory))
    with pytest.raises(ValueError, match="unknown template"):
        load_prompts(str(tmp_path / "p.txt"), template="instruct")


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"question": "ok", "answer": "1"}\n\n{"question": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 3: not valid UTF-8"):
        load_prompts(str(path))
    path.write_bytes(b'{"question": "caf\xc3\xa9", "answer": "2"}\r\n')  # valid UTF-8, CRLF line ends
    assert load_prompts(str(path), template="raw")[0]["question"] == "caf\u00e9"


@pytest.mark.parametrize("value, shown", [
    ("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf"),  # JSON extensions Python's json accepts: floats
    ('"nan"', "nan"), ('" INF "', "INF"), ('"-inf"', "-inf"), ('"+inf"', "+inf"), ('"Infinity"', "Infinity"),
    ('"-infinity"', "-infinity"), ('"work\\n#### nan"', "nan"),
])
def test_non_finite_gold_answer_names_the_row(tmp_path, value, shown):
    path = write_jsonl(tmp_path / "bad.jsonl", ['{"question": "ok", "answer": "1"}',
                                                '{"question": "q", "answer": %s}' % value])
    with pytest.raises(ValueError, match=rf"bad\.jsonl, line 2: gold answer '{re.escape(shown)}' is not a finite "
                                         r"value$"):
        load_prompts(path)


def test_non_finite_gold_in_parquet_and_finite_lookalikes(tmp_path):
    pq.write_table(pa.table({"question": ["a", "b"], "answer": [1.5, float("nan")]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"bad\.parquet, row 2: gold answer 'nan' is not a finite value"):
        load_prompts(str(tmp_path / "bad.parquet"))
    golds = ["\\infty", "-\\infty", "infinite", "Nancy", "1e999", "inf+1"]  # answers, not a float's non-value
    path = write_jsonl(tmp_path / "ok.jsonl", [{"question": "q", "answer": g} for g in golds])
    assert [r["answer"] for r in load_prompts(path)] == golds


def test_gsm8k_final_answer():
    assert gsm8k_final_answer("She pays 3 * 400 = 1,200 dollars.\n#### 1,200") == "1200"
    assert gsm8k_final_answer("#### 3\nlater\n####  -4 \r\nnote") == "-4"  # the last marker line, only its line
    assert gsm8k_final_answer("12") is None and gsm8k_final_answer("a #### 5") is None  # not at a line start
    with pytest.raises(ValueError, match="no answer after it"):
        gsm8k_final_answer("work\n####  \n")


def test_gsm8k_form_in_a_local_file_is_extracted_and_logged(tmp_path, caplog):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": "Q1?", "answer": "3 * 400 = 1,200\n#### 1,200"},
                                              {"question": "Q2?", "answer": "#### 7"},
                                              {"question": "Q3?", "answer": "5"},
                                              {"question": "Q4?", "answer": 76}])
    with caplog.at_level(logging.INFO, logger="machinery.data"):
        rows = load_prompts(path, template="raw")
    assert [r["answer"] for r in rows] == ["1200", "7", "5", "76"]
    messages = [r.getMessage() for r in caplog.records if r.name == "machinery.data"]
    assert len(messages) == 1 and "2 rows read in GSM8K form" in messages[0] and "g.jsonl" in messages[0]
    # an explicit answer_field still holds a worked solution: it is extracted too
    path = write_jsonl(tmp_path / "h.jsonl", [{"q": "Q?", "solution": "2 + 2 = 4\n#### 4"}])
    assert load_prompts(path, question_field="q", answer_field="solution")[0]["answer"] == "4"


def test_gsm8k_marker_without_an_answer_names_the_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"question": "Q?", "answer": "#### 1"},
                                                {"question": "Q?", "answer": "work\n####\t "}])
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2: GSM8K final-answer line '####' has no answer"):
        load_prompts(path)


def test_gsm8k_form_under_another_dataset_name(monkeypatch, caplog):
    fake_datasets(monkeypatch, [{"question": "Q?", "answer": "work\n#### 1,234"}])
    with caplog.at_level(logging.INFO, logger="machinery.data"):
        assert load_prompts("someone/gsm8k-copy")[0]["answer"] == "1234"
    assert "someone/gsm8k-copy: 1 rows read in GSM8K form" in caplog.text
    fake_datasets(monkeypatch, [{"question": "Q?", "answer": "work\n#### 1,234"}])
    assert load_prompts("openai/gsm8k", answer_field="answer")[0]["answer"] == "1234"  # preset's field, explicit


def test_gsm8k_preset(monkeypatch):
    calls = fake_datasets(monkeypatch, [{"question": "Q1?", "answer": "work\n#### 1,234"},
                                        {"question": "Q2?", "answer": "#### 7"}])
    rows = load_prompts("openai/gsm8k", split="test", template="raw")
    assert calls == [("openai/gsm8k", "main", "test")]
    assert [(r["question"], r["answer"]) for r in rows] == [("Q1?", "1234"), ("Q2?", "7")]
    fake_datasets(monkeypatch, [{"question": "Q1?", "answer": "no marker"}])
    with pytest.raises(ValueError, match=r"openai/gsm8k \(train\), row 1.*####"):
        load_prompts("openai/gsm8k")


def test_dapo_preset_strips_its_template_and_dedupes(monkeypatch):
    def row(question, answer):
        return {"data_source": "math_dapo", "prompt": [{"content": DAPO_PREFIX + question + DAPO_SUFFIX,
                                                        "role": "user"}],
                "ability": "MATH", "reward_model": {"ground_truth": answer, "style": "rule-lean"},
                "extra_info": {"index": "x"}}

    fake_datasets(monkeypatch, [row("Find x.", "3"), row("Find x.", "3"), row("Find y.", "4")])
    rows = load_prompts("BytedTsinghua-SIA/DAPO-Math-17k")
    assert [(r["question"], r["answer"]) for r in rows] == [("Find x.", "3"), ("Find y.", "4")]
    assert rows[0]["prompt"] == row("Find x.", "3")["prompt"][0]["content"]  # "base" rebuilds DAPO's prompt


def test_aime_and_math500_presets(monkeypatch):
    fake_datasets(monkeypatch, [{"ID": "2024-I-1", "Problem": "P?", "Solution": "s", "Answer": 204}])
    assert load_prompts("Maxwell-Jia/AIME_2024", template="raw")[0]["answer"] == "204"
    calls = fake_datasets(monkeypatch, [{"problem": "P?", "solution": "s", "answer": "\\frac{1}{2}"}])
    assert load_prompts("HuggingFaceH4/MATH-500", split="test")[0]["answer"] == "\\frac{1}{2}"
    assert calls == [("HuggingFaceH4/MATH-500", None, "test")]


def test_hub_name_offline_gives_a_clear_error(monkeypatch):
    fake_datasets(monkeypatch, error=ConnectionError("Couldn't reach the Hugging Face Hub"))
    with pytest.raises(RuntimeError, match=r"openai/gsm8k.*Offline, give a local \.jsonl or \.parquet"):
        load_prompts("openai/gsm8k")


def llama_style_tokenizer():
    """A local tokenizer that adds a BOS on encoding and whose chat template writes one too (as Llama's do)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    words = ["<s>", "</s>", "<unk>", "[INST]", "[/INST]", "x", "What", "is", "6*7?"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.chat_template = "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"
    return tok


def test_chat_prompts_carry_one_bos_where_the_template_writes_it():
    """#31.5: the engines tokenise prompts with special tokens; a template that writes the BOS itself gave two."""
    tok = llama_style_tokenizer()
    raw = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    assert tok(raw)["input_ids"][:2] == [0, 0]  # the finding: the template's BOS and the tokenizer's
    ids = tok(format_prompt("What is 6*7?", "chat", tok))["input_ids"]
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id
    # the same ids as verl's: the full template tokenised without special tokens
    full = tok.apply_chat_template([{"role": "user", "content": format_prompt("What is 6*7?", "base")}],
                                   tokenize=False, add_generation_prompt=True)
    assert ids == tok(full, add_special_tokens=False)["input_ids"]
    # a tokenizer that adds no BOS (Qwen's, the built-in's) keeps the template's text as it is
    qwen = build_tokenizer()
    qwen.chat_template = "<s>{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert format_prompt("q", "chat", qwen).startswith("<s>")
