package tiktokencount

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/dlclark/regexp2"
)

// asciiAlphabet holds every kind of ASCII character the patterns tell
// apart: letters of both cases (those of the contractions among them),
// digits, each white space character, the apostrophe, the slash and other
// punctuation, and control characters that are not white space.
const asciiAlphabet = "aAbZsStTrReEvVmMlLdDxX019 \t\n\v\f\r'/.,!-_\"{}\x00\x1f\x7f"

// splitTests are texts where the alternatives' order and backtracking
// matter.
var splitTests = []string{
	"", "a", " ", "\n", "hello world", "Hello World", "HELLO world", "HELLOworld", "helloWorld", "ABc", "aBC",
	"don't", "DON'T", "we're they've I'm you'll he'd it's 'S 'T 'Re 'vE 'M 'LL 'D", "'sup 'x ' s", "rock'n'roll", "''s",
	"1234567", "a1b22c333d4444", "x/y/z\n/\n", "a.b,c!d", " .a", " ..\n\n//x", ". \n", "!\r\n\r\n/",
	"a  b", "a   b", "a \n b", "a \n\n  b", "a\r\n\tb", "  \t\v\f", "a \t", "\n\n\n", " \r \n ", "x\v\fy",
	"\x00\x01a", "\x7fHello", "(x) [y] {z}", "'\n's", " 's", "\t'll", "end. ", "end.  ", "A B C", " A",
	`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`, "func main() {\n\tfmt.Println(\"hi\")\n}\n",
}

func TestASCIISplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	texts := slices.Clone(splitTests)
	for range 5000 {
		var b strings.Builder
		for range rng.IntN(24) {
			b.WriteByte(asciiAlphabet[rng.IntN(len(asciiAlphabet))])
		}
		texts = append(texts, b.String())
	}
	for _, enc := range []struct {
		name    string
		pattern string
		split   asciiSplitter
	}{{CL100KBase, cl100kPattern, splitCL100K}, {O200KBase, o200kPattern, splitO200K}} {
		re := regexp2.MustCompile(enc.pattern, regexp2.None)
		for _, text := range texts {
			if got, want := asciiPieces(text, enc.split), patternPieces(t, re, text); !slices.Equal(got, want) {
				t.Errorf("%s: %q splits into %q, the pattern into %q", enc.name, text, got, want)
			}
		}
	}
}

// FuzzASCIISplit: on any ASCII text, each splitter cuts where its pattern
// does. The seed corpus runs in every go test.
func FuzzASCIISplit(f *testing.F) {
	for _, s := range splitTests {
		f.Add(s)
	}
	cl := regexp2.MustCompile(cl100kPattern, regexp2.None)
	o := regexp2.MustCompile(o200kPattern, regexp2.None)
	f.Fuzz(func(t *testing.T, text string) {
		if !isASCII(text) {
			return
		}
		if got, want := asciiPieces(text, splitCL100K), patternPieces(t, cl, text); !slices.Equal(got, want) {
			t.Fatalf("cl100k_base: %q splits into %q, the pattern into %q", text, got, want)
		}
		if got, want := asciiPieces(text, splitO200K), patternPieces(t, o, text); !slices.Equal(got, want) {
			t.Fatalf("o200k_base: %q splits into %q, the pattern into %q", text, got, want)
		}
	})
}

func asciiPieces(text string, split asciiSplitter) []string {
	var pieces []string
	for i := 0; i < len(text); {
		end := split(text, i)
		pieces = append(pieces, text[i:end])
		i = end
	}
	return pieces
}

func patternPieces(t *testing.T, re *regexp2.Regexp, text string) []string {
	t.Helper()
	var pieces []string
	m, err := re.FindStringMatch(text)
	for ; m != nil && err == nil; m, err = re.FindNextMatch(m) {
		pieces = append(pieces, m.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	return pieces
}
