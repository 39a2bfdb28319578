package main

import (
	"errors"
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
