package spender

import (
	"hash/fnv"
	"testing"
)

// TestRouteScoreIsDocumented: a score is fmix64 of the standard FNV-1a 64
// (hash/fnv's) of name, a zero byte and key, and its values do not move:
// another gateway version must score a key alike.
func TestRouteScoreIsDocumented(t *testing.T) {
	for _, tc := range []struct {
		name, key string
		want      uint64
	}{
		{"eu-1", "key-0", 0x54e4416ca7936b5f},
		{"eu-1", "key-1", 0x68dfd8689f6659a6},
		{"eu-1", "team:acme", 0xa08a896c47aa31d5},
		{"eu-1", "", 0xc29ba8c01bd8aad8},
	} {
		h := fnv.New64a()
		h.Write([]byte(tc.name + "\x00" + tc.key))
		if got, std := fnv1a(namePrefix(tc.name), tc.key), h.Sum64(); got != std {
			t.Errorf("FNV-1a(%q ‖ 0 ‖ %q) = %#x, hash/fnv says %#x", tc.name, tc.key, got, std)
		}
		if got := fmix64(fnv1a(namePrefix(tc.name), tc.key)); got != tc.want {
			t.Errorf("score(%q, %q) = %#x, want %#x", tc.name, tc.key, got, tc.want)
		}
	}
}
