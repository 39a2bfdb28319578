package main

import (
	"errors"
	"flag"
	"io"
	"testing"
)

// TestPrefixedOnce: an error from the allocator package is printed with its
// own prefix, not "allocator: allocator: ...".
func TestPrefixedOnce(t *testing.T) {
	for _, tc := range []struct{ err, want string }{
		{"allocator: open store /x: timeout", "allocator: open store /x: timeout"},
		{"flag provided but not defined: -x", "allocator: flag provided but not defined: -x"},
	} {
		if got := prefixed(errors.New(tc.err)); got != tc.want {
			t.Errorf("prefixed(%q) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// TestHelpIsNotAFailure: -help returns flag.ErrHelp, which main treats as
// a clean exit (status 0), not as a bad flag (status 2).
func TestHelpIsNotAFailure(t *testing.T) {
	_, err := parseConfig([]string{"-help"}, func(string) string { return "" }, io.Discard)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("parseConfig(-help) = %v, want flag.ErrHelp", err)
	}
}

// TestCommitHealth: /readyz follows the last commit: a failed one makes
// the allocator unready until a commit succeeds again.
func TestCommitHealth(t *testing.T) {
	var h commitHealth
	if h.err() != nil {
		t.Fatal("unready before any commit")
	}
	h.observe(errors.New("no space left on device"))
	if err := h.err(); err == nil || err.Error() != "no space left on device" {
		t.Fatalf("after a failed commit: %v", err)
	}
	h.observe(nil)
	if err := h.err(); err != nil {
		t.Fatalf("after a commit succeeded again: %v", err)
	}
}
