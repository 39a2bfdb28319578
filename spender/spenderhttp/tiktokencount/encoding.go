package tiktokencount

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strconv"

	"github.com/dlclark/regexp2"
	"github.com/pkoukk/tiktoken-go-loader/assets"
)

// The encodings' splitting patterns, as OpenAI's tiktoken defines them
// (tiktoken_ext/openai_public.py): text is cut into the pieces these match,
// left to right, and each piece is encoded on its own.
const (
	cl100kPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	o200kPattern  = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?` +
		`|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?` +
		`|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// encoding is one loaded encoding: its merge ranks and its splitter. It
// is never written after loadEncoding returns, so counts may run on it
// concurrently.
type encoding struct {
	name string
	// ranks maps each token's bytes to its rank: the order in which byte
	// pair encoding merges. Its keys are substrings of one string holding
	// every token, so the table costs one allocation, not one per token.
	ranks map[string]uint32
	// pattern splits any text; ascii splits text of ASCII characters
	// only, with the same result, without the regular expression engine.
	pattern *regexp2.Regexp
	ascii   asciiSplitter
	roles   map[string]int64 // tokens of the common roles
}

// loadEncoding parses the named encoding's BPE file, embedded by
// tiktoken-go-loader ("<base64 token> <rank>" per line).
func loadEncoding(name string) (*encoding, error) {
	var pattern string
	var ascii asciiSplitter
	switch name {
	case CL100KBase:
		pattern, ascii = cl100kPattern, splitCL100K
	case O200KBase:
		pattern, ascii = o200kPattern, splitO200K
	default:
		return nil, fmt.Errorf("tiktokencount: unknown encoding %q", name)
	}
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("tiktokencount: %s pattern: %w", name, err)
	}
	file, err := assets.Assets.ReadFile(name + ".tiktoken")
	if err != nil {
		return nil, fmt.Errorf("tiktokencount: loading %s: %w", name, err)
	}
	lines := bytes.Count(file, []byte("\n")) + 1
	// Every token in one buffer: decoded tokens are shorter than their
	// base64, so the file's size bounds it.
	all := make([]byte, 0, len(file))
	type entry struct {
		start, end int
		rank       uint32
	}
	entries := make([]entry, 0, lines)
	for n, line := range bytes.Split(file, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		tok, rank, ok := bytes.Cut(line, []byte(" "))
		if !ok {
			return nil, fmt.Errorf("tiktokencount: %s line %d: no rank", name, n+1)
		}
		r, err := strconv.ParseUint(string(rank), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("tiktokencount: %s line %d: %w", name, n+1, err)
		}
		start := len(all)
		all, err = base64.StdEncoding.AppendDecode(all, tok)
		if err != nil {
			return nil, fmt.Errorf("tiktokencount: %s line %d: %w", name, n+1, err)
		}
		entries = append(entries, entry{start, len(all), uint32(r)})
	}
	s := string(all)
	e := &encoding{name: name, ranks: make(map[string]uint32, len(entries)), pattern: re, ascii: ascii, roles: make(map[string]int64)}
	for _, en := range entries {
		e.ranks[s[en.start:en.end]] = en.rank
	}
	for _, r := range []string{"system", "developer", "user", "assistant", "tool", "function"} {
		e.roles[r] = e.count(r)
	}
	return e, nil
}

// count returns the number of tokens text encodes to. Special tokens'
// text (such as "<|endoftext|>") counts as ordinary text, as the API
// treats a client's text.
func (e *encoding) count(text string) int64 {
	if text == "" {
		return 0
	}
	var n int64
	if isASCII(text) {
		for i := 0; i < len(text); {
			end := e.ascii(text, i)
			n += e.pieceTokens(text[i:end])
			i = end
		}
		return n
	}
	// The pattern's matches are in characters; invalid UTF-8 bytes become
	// U+FFFD, one character each, as tiktoken's own Go ports encode them.
	runes := []rune(text)
	m, _ := e.pattern.FindRunesMatch(runes)
	for m != nil {
		n += e.pieceTokens(string(runes[m.Index : m.Index+m.Length]))
		m, _ = e.pattern.FindNextMatch(m)
	}
	return n
}

// pieceTokens returns the number of tokens one piece of the split encodes
// to: 1 for a piece that is a token, else what byte pair encoding leaves.
func (e *encoding) pieceTokens(piece string) int64 {
	if _, ok := e.ranks[piece]; ok {
		return 1
	}
	return int64(e.mergeCount(piece))
}

// noRank marks a pair that is not a token.
const noRank = ^uint32(0)

// part is one part of a piece during byte pair encoding: where it starts,
// and the rank of the token it would make merged with the next part.
type part struct {
	start int
	rank  uint32
}

// mergeCount runs byte pair encoding on piece (at least 2 bytes) and
// returns how many tokens are left: starting from single bytes, the
// adjacent pair whose merge is the lowest-ranked token is merged, the
// leftmost on a tie, until no adjacent pair is a token. This is tiktoken's
// _byte_pair_merge, counting instead of collecting the tokens.
func (e *encoding) mergeCount(piece string) int {
	var stack [64]part
	parts := stack[:0]
	if len(piece)+1 > len(stack) {
		parts = make([]part, 0, len(piece)+1)
	}
	for i := range len(piece) - 1 {
		parts = append(parts, part{i, e.rankOf(piece[i : i+2])})
	}
	parts = append(parts, part{len(piece) - 1, noRank}, part{len(piece), noRank})
	// rankAfter is the rank of parts i and i+1 merged with part i+2, read
	// before part i+1 is removed.
	rankAfter := func(i int) uint32 {
		if i+3 < len(parts) {
			return e.rankOf(piece[parts[i].start:parts[i+3].start])
		}
		return noRank
	}
	for {
		best, at := noRank, -1
		for i, p := range parts[:len(parts)-1] {
			if p.rank < best {
				best, at = p.rank, i
			}
		}
		if at < 0 {
			break
		}
		if at > 0 {
			parts[at-1].rank = rankAfter(at - 1)
		}
		parts[at].rank = rankAfter(at)
		parts = append(parts[:at+1], parts[at+2:]...)
	}
	return len(parts) - 1
}

func (e *encoding) rankOf(b string) uint32 {
	if r, ok := e.ranks[b]; ok {
		return r
	}
	return noRank
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
