package echo

import (
	"hash/fnv"
	"strings"
	"unicode"
)

// VocabSize bounds the token IDs /v1/tokenize returns: every ID is in
// [0, VocabSize).
const VocabSize = 100_000

// Words splits text into the engine's tokens: its whitespace-separated
// words (strings.Fields). An empty or all-space text has none.
func Words(text string) []string { return strings.Fields(text) }

// CountTokens returns len(Words(text)) without allocating.
func CountTokens(text string) int {
	n, in := 0, false
	for _, r := range text {
		space := unicode.IsSpace(r)
		if !space && !in {
			n++
		}
		in = !space
	}
	return n
}

// TokenID returns the ID /v1/tokenize reports for word: FNV-1a (32-bit)
// of its bytes, modulo VocabSize. Different words may share an ID.
func TokenID(word string) int64 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(word))
	return int64(h.Sum32() % VocabSize)
}

// reply returns the echo of text: its first limit words (all of them when
// limit is 0), its word count, and whether the echo was cut. It holds only
// the words it returns, so a long prompt answered with a few words costs
// no slice of every word.
func reply(text string, limit int64) (out []string, count int64, truncated bool) {
	for w := range strings.FieldsSeq(text) {
		if limit <= 0 || int64(len(out)) < limit {
			out = append(out, w)
		}
		count++
	}
	return out, count, limit > 0 && count > limit
}

// finishReason is "length" when the reply was cut at the max, else
// "stop".
func finishReason(truncated bool) string {
	if truncated {
		return "length"
	}
	return "stop"
}
