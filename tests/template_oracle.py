#!/usr/bin/python3
"""Reference renderer for chat templates: jinja2 configured exactly the way
Hugging Face transformers renders `tokenizer.chat_template`.

What transformers does (src/transformers/utils/chat_template_utils.py:
`_compile_jinja_template` -> `_cached_compile_jinja_template` builds the
environment, `render_jinja_template` renders):

  * environment: jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    AssistantTracker adds the `{% generation %}...{% endgeneration %}` tag;
    it renders its body unchanged (it only records character offsets when
    return_assistant_tokens_mask is requested).
  * env.filters["tojson"] = tojson, where
        tojson(x, ensure_ascii=False, indent=None, separators=None,
               sort_keys=False) = json.dumps(x, ensure_ascii=ensure_ascii,
               indent=indent, separators=separators, sort_keys=sort_keys)
  * env.globals["raise_exception"] = raise_exception, raising
    jinja2.exceptions.TemplateError(message)
  * env.globals["strftime_now"] = strftime_now: datetime.now().strftime(format)
    (here: the fixed date given by the case, at midnight, for determinism)
  * the helpers are closures of _cached_compile_jinja_template, which shows
    in Python's TypeError messages when a template calls them wrongly.
  * template.render(messages=chat, tools=tool_schemas, documents=documents,
        add_generation_prompt=add_generation_prompt, **kwargs)
    where tools and documents are None when not given and kwargs holds the
    tokenizer's special tokens (bos_token, eos_token, ...) and any extra
    template kwargs.

Usage:
  template_oracle.py JOBS.json OUT.json
      JOBS = {"templates": {name: source},
              "cases": [{"template": name,
                         "messages": [...]      (omitted: not passed),
                         "tools": [...] | null,
                         "add_generation_prompt": bool,
                         "bos_token": str, "eos_token": str,
                         "date": "YYYY-MM-DD",
                         "extra": {...}}]}
      OUT  = {"results": [{"ok": true, "output": str} |
                          {"ok": false, "error": str, "error_type": str}]}
  template_oracle.py --template FILE --conversation FILE [--agp]
      renders one case to stdout (for debugging).
"""
import datetime
import json
import sys
import warnings

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationExtension(jinja2.ext.Extension):
    """`{% generation %}body{% endgeneration %}` renders body (HF AssistantTracker)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_generation_support")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def _cached_compile_jinja_template(date):
    """Environment set up as transformers' function of this name does; the
    helpers are nested like there, so Python's argument errors name them
    `_cached_compile_jinja_template.<locals>.raise_exception` etc."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    day = datetime.datetime.strptime(date, "%Y-%m-%d")

    def strftime_now(format):  # HF: datetime.now().strftime(format); here a fixed day
        return day.strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[GenerationExtension, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


make_env = _cached_compile_jinja_template


def render_case(templates, case, compiled):
    date = case.get("date", "2025-03-14")
    key = (case["template"], date)
    if key not in compiled:
        try:
            compiled[key] = make_env(date).from_string(templates[case["template"]])
        except Exception as e:  # syntax errors are results too
            compiled[key] = e
    tpl = compiled[key]
    if isinstance(tpl, Exception):
        raise tpl
    kwargs = {"tools": case.get("tools"), "documents": None,
              "add_generation_prompt": bool(case.get("add_generation_prompt", False)),
              "bos_token": case.get("bos_token", "<s>"),
              "eos_token": case.get("eos_token", "</s>")}
    if "messages" in case:
        kwargs["messages"] = case["messages"]
    kwargs.update(case.get("extra") or {})
    return tpl.render(**kwargs)


def run_jobs(jobs_path, out_path):
    # jinja2 compiles templates to Python; constant expressions such as
    # 5[1:2] make the compiler warn. The render result is what matters.
    warnings.filterwarnings("ignore", category=SyntaxWarning)
    with open(jobs_path, encoding="utf-8") as f:
        jobs = json.load(f)
    compiled = {}
    results = []
    for case in jobs["cases"]:
        try:
            out = render_case(jobs["templates"], case, compiled)
            results.append({"ok": True, "output": out})
        except Exception as e:
            results.append({"ok": False, "error": str(e), "error_type": type(e).__name__})
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"results": results}, f, ensure_ascii=False)


def run_single(argv):
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--template", required=True)
    ap.add_argument("--conversation", required=True)
    ap.add_argument("--agp", action="store_true", help="add_generation_prompt")
    a = ap.parse_args(argv)
    with open(a.template, encoding="utf-8") as f:
        src = f.read()
    with open(a.conversation, encoding="utf-8") as f:
        conv = json.load(f)
    case = {"template": "t", "messages": conv["messages"], "tools": conv.get("tools"),
            "add_generation_prompt": a.agp, "extra": conv.get("extra")}
    sys.stdout.write(render_case({"t": src}, case, {}))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("--"):
        run_single(sys.argv[1:])
    elif len(sys.argv) == 3:
        run_jobs(sys.argv[1], sys.argv[2])
    else:
        sys.exit(__doc__)
