#!/usr/bin/env python3
"""tests/test_tiny_model.py GPT2D MODEL_DIR: the shipped default model,
models/gpt2d-tiny, is what its card says.

- Its files match SHA256SUMS (a changed or truncated weight file fails).
- Served by gpt2d, it names itself: /v1/models lists gpt2d-tiny, owned by
  gpt2d, with trained weights and a description that says it is not
  OpenAI's GPT-2.
- Its held-out perplexity, measured through the API exactly as the card's
  figure was (tools/train/heldout_ppl.py: windows of eval.json's size,
  max_tokens 0, echo, logprobs 0, over heldout.u16, text that is not in the
  training data), is the card's figure within 1 % (the kernel path differs
  between CPUs: AVX512_BF16 rounds activations to BF16, AVX2 does not), and
  far below a random model's (about the vocabulary's size, 50,257). Under
  the sanitizers (GPT2D_SANITIZE, a -O0 build) only the first 8 windows are
  scored, against eval.json's figure for them.
- Its held-out perplexity on text of another source (other_heldout.u16:
  Debian's constitution, social contract and bug-tracking guides from
  doc-debian, and the Debian Reference, none of it trained on) is
  eval.json's other-source figure within 1 % (not under the sanitizers).
- It talks: of the 100 ordinary chat prompts of chat_prompts.txt, each the
  one user message of a /v1/chat/completions request through the built-in
  chat template, at least 95 % get a reply with at least one word, greedy
  and at temperature 0.8 (seed 1, max_tokens 48; tools/train/chat_rate.py,
  eval.json's "chat" has the rates measured for the card)."""
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lib"))
import gpt2d_server as gs  # noqa: E402

gpt2d, model = sys.argv[1], sys.argv[2]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


for line in open(os.path.join(model, "SHA256SUMS")):
    digest, name = line.split()
    with open(os.path.join(model, name), "rb") as f:
        check(hashlib.sha256(f.read()).hexdigest() == digest, f"{name} matches SHA256SUMS")

card = json.load(open(os.path.join(model, "eval.json")))
with tempfile.TemporaryDirectory() as tmp:
    srv = gs.Server(gpt2d, model, [], log_path=os.path.join(tmp, "log"))
    try:
        with urllib.request.urlopen(srv.base + "/v1/models", timeout=30) as r:
            models = json.load(r)["data"]
        m = models[0] if models else {}
        check(m.get("id") == "gpt2d-tiny", f"/v1/models names gpt2d-tiny ({m.get('id')})")
        check(m.get("owned_by") == "gpt2d", f"owned by gpt2d ({m.get('owned_by')})")
        check(m.get("weights") == "trained", f"weights trained ({m.get('weights')})")
        check("not OpenAI's GPT-2" in (m.get("description") or ""), "the description says it is not OpenAI's GPT-2")
        check("gpt2d-tiny" in srv.log() and "random weights" not in srv.log().lower(),
              "the start-up log names gpt2d-tiny and no random weights")
        sanitized = os.environ.get("GPT2D_SANITIZE", "none") not in ("", "none")
        if sanitized:
            card = dict(card["first_8_windows"], window=card["window"])
            card["heldout_perplexity"] = card["perplexity"]
        out = subprocess.run([sys.executable, os.path.join(HERE, "..", "tools", "train", "heldout_ppl.py"),
                              srv.base, os.path.join(model, "heldout.u16"), "--window", str(card["window"])]
                             + (["--max-windows", "8"] if sanitized else []),
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            check(False, "heldout_ppl.py ran: " + out.stderr[-500:])
        else:
            got = json.loads(out.stdout)
            want = card["heldout_perplexity"]
            check(got["tokens"] == card["tokens"], f"scored {got['tokens']} held-out tokens ({card['tokens']} on the card)")
            check(abs(got["perplexity"] / want - 1) <= 0.01,
                  f"held-out perplexity {got['perplexity']:.2f} is the card's {want:.2f} within 1 %")
            check(got["perplexity"] < 1000, "far below a random model's (about 50,257)")
        other = json.load(open(os.path.join(model, "eval.json")))["other_source"]
        if not sanitized:
            out = subprocess.run([sys.executable, os.path.join(HERE, "..", "tools", "train", "heldout_ppl.py"),
                                  srv.base, os.path.join(model, "other_heldout.u16"), "--window", str(other["window"])],
                                 capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                check(False, "heldout_ppl.py ran on other_heldout.u16: " + out.stderr[-500:])
            else:
                got = json.loads(out.stdout)
                want = other["perplexity"]
                check(got["tokens"] == other["tokens"], f"scored {got['tokens']} other-source tokens ({other['tokens']})")
                check(abs(got["perplexity"] / want - 1) <= 0.01,
                      f"other-source perplexity {got['perplexity']:.2f} is the card's {want:.2f} within 1 %")
        sys.path.insert(0, os.path.join(HERE, "..", "tools", "train"))
        import chat_rate  # noqa: E402
        chat = chat_rate.rates(srv.base, chat_rate.prompts(os.path.join(model, "chat_prompts.txt")))
        check(chat["prompts"] == 100, f"chat_prompts.txt has 100 prompts ({chat['prompts']})")
        for mode in ("greedy", "temperature_0.8"):
            got = chat[mode]
            check(got["rate"] >= 0.95, f"chat, {mode}: {got['replied']} of {chat['prompts']} prompts get a reply "
                  f"with a word (>= 95 %; without one: {got['no_word'][:5]})")
    finally:
        srv.terminate(30)
        srv.stop()

sys.exit(1 if failures else 0)
