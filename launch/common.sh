# Shared by the launch scripts (sourced, not run): print or run a command, quoted for a shell.
# shellcheck shell=bash

DRY_RUN=${DRY_RUN:-0}

# One word, quoted for a POSIX shell only when it needs it.
quote_word() {
  case $1 in
    '' | *[!A-Za-z0-9_./:=,+@%^-]*) printf "'%s'" "${1//\'/\'\\\'\'}" ;;
    *) printf '%s' "$1" ;;
  esac
}

# A command line, each word quoted as needed, words separated by one space.
quote_line() {
  local word line=""
  for word in "$@"; do
    line+="${line:+ }$(quote_word "$word")"
  done
  printf '%s\n' "$line"
}

# Runs a command, or with DRY_RUN=1 prints exactly the line that would run.
run() {
  if [[ $DRY_RUN == 1 ]]; then
    quote_line "$@"
  else
    "$@"
  fi
}

die() {
  printf '%s: error: %s\n' "${0##*/}" "$1" >&2
  exit 2
}
