#!/usr/bin/env bash
# Repository checks run by `make test` (fast, no build needed):
# 1. Documentation pointers a clone can follow: no tracked file cites the specification
#    that lived outside the repository (../shared/SPEC.md) or a "SPEC §n" section of it,
#    and every "DESIGN.md §n" names a section that docs/DESIGN.md has. Spec-Bench prompts
#    under ../shared/data/ are data, not documentation: they stay allowed.
# 2. Layering: the engine's folders (what rootspec-target and rootspec-draft link) include
#    nothing from bench/ or serve/, libraries of their own for their programs and the tests.
# 3. Every repository path a Markdown document names (README.md, docs/, PROTOCOL.md) exists,
#    so a file that moves takes its documentation with it.
# 4. Backend layout: CUDA sources (.cu, .cuh, cuda_*) of the engine live in kernels/cuda/,
#    and only kernels/cuda/, the CUDA tests and the GPU benchmark include its headers, so
#    the CPU build never reaches into the CUDA backend.
# 5. No issue or pull-request numbers in code or documents: a reader of a clone cannot look
#    them up; say what the thing is instead.
# 6. One name per type and per idea: a parameter or local Decode is `dec`, a DecodeOpts
#    `opts` (a second one in a scope: opts_NAME), a Drafter `d` (a Drafter ** out-parameter
#    `out`), an EngineOpts `eo`, a Tokenizer `tok`, a DecodeResult `res`; the short names
#    these types once shared are refused in declarations. What --decoder picks is a
#    DecoderKind (DECODER_*, decoder_name, DecodeOpts.decoder), never a "Rule".
set -euo pipefail
cd "$(dirname "$0")/.."
self=tests/check_repo.sh
design=docs/DESIGN.md

# NUL-separated list of the files to check: tracked files in a git checkout, else every
# file outside build/ (a source tarball).
list_files() {
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z
  else
    find . \( -path ./build -o -path ./.git \) -prune -o -type f -print0 | sed -z 's#^\./##'
  fi
}

fail=0
# -I: binary fixtures are not documentation.
stale=$(list_files | grep -zv -x -e "$self" | xargs -0 grep -InE 'shared/SPEC\.md|SPEC §|SPEC section' -- || true)
if [ -n "$stale" ]; then
  echo "check_repo: these lines cite the old SPEC; point them at $design (same section numbers):"
  echo "$stale"
  fail=1
fi

if [ ! -f "$design" ]; then
  echo "check_repo: $design is missing"
  exit 1
fi
# Every section a file cites ("DESIGN.md §3", "DESIGN.md §3-§5", "DESIGN.md section 8").
cited=$(list_files | xargs -0 grep -IhoE 'DESIGN(\.md)? (§[0-9]+(-§[0-9]+)?|section [0-9]+)' -- \
          | grep -oE '[0-9]+' | sort -un || true)
for n in $cited; do
  if ! grep -qE "^## $n\. " "$design"; then
    echo "check_repo: a file cites DESIGN.md §$n, but $design has no section '## $n.':"
    list_files | xargs -0 grep -InE "DESIGN(\.md)? (§$n\b|§[0-9]+-§$n\b|section $n\b)" -- || true
    fail=1
  fi
done

engine_dirs="common kernels proto draft_proc target_proc"
up=$(list_files | grep -zE "^($(echo $engine_dirs | tr ' ' '|'))/" \
       | xargs -0 grep -InE '#[[:space:]]*include[[:space:]]*"(\.\./)?(bench|serve)/' -- || true)
if [ -n "$up" ]; then
  echo "check_repo: the engine ($engine_dirs) must not include bench/ or serve/ headers:"
  echo "$up"
  fail=1
fi

top='common|kernels|proto|draft_proc|target_proc|serve|bench|deploy|tests|tools|docs'
for p in $(list_files | grep -z '\.md$' \
             | xargs -0 grep -ohE "\b($top)/[A-Za-z0-9_./-]*[A-Za-z0-9_/]" -- | sort -u); do
  if [ ! -e "$p" ]; then
    echo "check_repo: a document names '$p', which does not exist:"
    list_files | grep -z '\.md$' | xargs -0 grep -nF -- "$p" || true
    fail=1
  fi
done

stray=$(list_files | grep -zE "^($(echo $engine_dirs | tr ' ' '|'))/" | grep -zv '^kernels/cuda/' \
          | grep -zE '\.(cu|cuh)$|(^|/)cuda_[^/]*$' | tr '\0' '\n' || true)
if [ -n "$stray" ]; then
  echo "check_repo: CUDA files of the engine belong in kernels/cuda/:"
  echo "$stray"
  fail=1
fi
reach=$(list_files | grep -zE "^($(echo $engine_dirs | tr ' ' '|'))/" | grep -zv '^kernels/cuda/' \
          | xargs -0 grep -InE '#[[:space:]]*include[[:space:]]*"kernels/cuda/' -- || true)
if [ -n "$reach" ]; then
  echo "check_repo: only kernels/cuda/, tests/ and bench/ include kernels/cuda/ headers:"
  echo "$reach"
  fail=1
fi

# "issue 12", "Issues #4", "issue-7", identifiers such as issue15 or issue_15, "PR 9", "#31"
# (not "&#31;", "$#" or a path), and "the issue's rule" / "this issue" (a ticket the reader
# does not have). Fixtures are data.
issue_re='issues?[ _#:-]*[0-9]+|pull[ -]?requests?[ _#:-]*[0-9]+|\bPR[ _#:-]*[0-9]+\b'
issue_re+="|\\b(the|this|that|per) issue('s)?\\b|(^|[^&\$A-Za-z0-9_/])#[0-9]+\\b"
issues=$(list_files | grep -zv -e '^tests/fixtures/' -e "^$self\$" \
           | xargs -0 grep -InEi "$issue_re" -- || true)
if [ -n "$issues" ]; then
  echo "check_repo: issue numbers a reader cannot look up; say what the thing is instead:"
  echo "$issues"
  fail=1
fi

# Declarations only: `Decode *d`, `const DecodeOpts *o`, `DecodeOpts d = ...`, `Drafter *dc`,
# `Planner *p`, `Pool *pl`, `Model *t`, `Selection *s`, `QTensor *t`, `BackendParams *p`,
# `ThreadPool *p`; fields too (`DecodeOpts d;`).
names_re='\bDecode \*+ ?(const )?(d|o|dc)\b|\bDecodeOpts \*+ ?(const )?(d|o|dp|dflt)\b'
names_re+='|\bDecodeOpts (d|o|dp|dflt) ?[=,)]|\bDrafter \*+ ?(const )?(dc|dl)\b|\bDrafter \*\*(d|pd)\b'
names_re+='|\bEngineOpts \*?(const )?o\b|\bTokenizer \*(const )?t\b|\bDecodeResult \*?r\b'
names_re+='|\bRule\b|\bRULE_[A-Z]+\b|\brule_(name|parse|needs_root)\('
names_re+='|\bPlanner \*(const )?p\b|\bPool \*?(const )?pl\b|\bModel \*(const )?t\b'
names_re+='|\bDecodeOpts (d|o|dflt);'
names_re+='|\bSelection \*?(const )?s\b|\bQTensor \*?(const )?t\b|\bBackendParams \*?(const )?p\b'
names_re+='|\bThreadPool \*(const )?p\b'
names=$(list_files | grep -zE '\.(c|h|cu|cuh)$' | xargs -0 grep -nE "$names_re" -- || true)
if [ -n "$names" ]; then
  echo "check_repo: one name per type: Decode is dec, DecodeOpts opts, Drafter d (Drafter ** out)," \
       "EngineOpts eo, Tokenizer tok, DecodeResult res, Planner pl, Pool p, Model m," \
       "Selection sel, QTensor w, BackendParams bp, ThreadPool tp;" \
       "--decoder's type is DecoderKind:"
  echo "$names"
  fail=1
fi

[ $fail -eq 0 ] && echo "check_repo: OK (no SPEC citations; $(echo $cited | wc -w) DESIGN.md sections cited, all present; the engine includes nothing from bench/ or serve/; every path the documents name exists; CUDA files only in kernels/cuda/; no issue numbers; one name per type)"
exit $fail
