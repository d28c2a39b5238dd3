#!/usr/bin/env python3
"""Renders the chat-template reference files in testdata/chat/ref.

Every testdata/chat/templates/<name>.jinja is rendered, with the variables
of templates/<name>.special.json, over every case of cases.json, the way HF
transformers' apply_chat_template renders (its _compile_jinja_template and
render call, copied here so that transformers itself is not needed). The
result goes to ref/<name>.json: {case: {"ok": text} | {"err": "Type: msg"}}.

testdata/chat/README.md ("How the references were rendered") describes the
setup; it was run with Python 3.11.7, jinja2 3.1.6 and markupsafe 3.0.3.
`make test` does not need this script: the references are committed.

Usage: scripts/render-chat-refs.py [testdata/chat]
"""

import glob
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %}...{% endgeneration %} tag; outside
    return_assistant_tokens_mask it renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def environment():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(template, case, special):
    variables = dict(case)
    variables.setdefault("tools", None)
    variables["documents"] = None
    variables.setdefault("add_generation_prompt", False)
    variables.update(special)
    try:
        return {"ok": template.render(**variables)}
    except Exception as e:  # the reference records what Python raised
        return {"err": f"{type(e).__name__}: {e}"}


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "testdata", "chat")
    with open(os.path.join(root, "cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    env = environment()
    for path in sorted(glob.glob(os.path.join(root, "templates", "*.jinja"))):
        name = os.path.basename(path)[: -len(".jinja")]
        # newline="": the source as stored; Jinja's lexer does its own
        # newline handling.
        with open(path, encoding="utf-8", newline="") as f:
            template = env.from_string(f.read())
        with open(os.path.join(root, "templates", name + ".special.json"), encoding="utf-8") as f:
            special = json.load(f)
        refs = {case: render(template, c, special) for case, c in cases.items()}
        with open(os.path.join(root, "ref", name + ".json"), "w", encoding="utf-8", newline="") as f:
            f.write(json.dumps(refs, ensure_ascii=False))
        failed = sorted(case for case, r in refs.items() if "err" in r)
        print(f"{name}: {len(refs) - len(failed)} renders, errors: {', '.join(failed) or 'none'}")


if __name__ == "__main__":
    main()
