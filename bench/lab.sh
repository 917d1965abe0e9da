# Sourced by the benches whose measurement is an example program of tests/integration run in the
# end-to-end lab (e2e.sh, ironic-interop.sh): the tool check, the lab's build, and the run that
# shows the example's BENCH lines as they come and keeps the rest for a failure.
# Needs ROOT, PROFILE and TARGET_DIR set by the caller.

# need_tools COMMAND:DEBIAN_PACKAGE ...: exits with the fix when a command is missing.
need_tools() {
  local tool
  for tool in "$@"; do
    command -v "${tool%%:*}" >/dev/null || { echo "${tool%%:*} missing: apt-get install ${tool#*:}" >&2; exit 1; }
  done
}

# lab_build EXAMPLE PACKAGE...: builds the packages' binaries and the example (unless BUILD=0),
# sets bindir, and exits when one of them is missing.
lab_build() {
  local example="$1" pkgs=() p b
  shift
  for p in "$@"; do pkgs+=(-p "$p"); done
  if [ "${BUILD:-1}" = 1 ]; then
    (cd "$ROOT" && cargo build --profile "$PROFILE" "${pkgs[@]}" --bins)
    (cd "$ROOT" && cargo build --profile "$PROFILE" -p vmdeploy-integration-tests --example "$example")
  fi
  bindir="$TARGET_DIR/$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")"
  for b in "${LAB_BINS[@]}" "examples/$example"; do
    [ -x "$bindir/$b" ] || { echo "$bindir/$b missing (run without BUILD=0)" >&2; exit 1; }
  done
}

# run_lab_example EXAMPLE [VAR=value ...]: runs the example with the lab's environment; prints
# its BENCH lines (a run takes minutes), and on failure the end of its whole output.
run_lab_example() {
  local example="$1" out
  shift
  out="$(mktemp "/var/tmp/vmdeploy-$example.XXXXXX")"
  # shellcheck disable=SC2064 # the path is fixed now, on purpose
  trap "rm -f '$out'" EXIT
  if ! (cd "$ROOT" && env VMDEPLOY_BIN_DIR="$bindir" RUST_LOG="${RUST_LOG:-warn}" "$@" \
    "$bindir/examples/$example") 2>&1 | tee "$out" \
    | grep --line-buffered '^BENCH' | sed -u 's/^BENCH \{0,1\}//'; then
    echo "the measurement failed; its output:" >&2
    tail -n 60 "$out" >&2
    exit 1
  fi
}
