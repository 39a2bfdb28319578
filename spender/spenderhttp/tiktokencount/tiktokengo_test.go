package tiktokencount_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/pkoukk/tiktoken-go"
	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
)

// TestCountsMatchTiktokenGo: every count equals the number of tokens
// github.com/pkoukk/tiktoken-go (v0.1.8, a port of OpenAI's tiktoken)
// encodes the text to, for both encodings, over prose, code, JSON,
// non-ASCII text (which this package splits with the pattern, not the
// ASCII splitters), invalid UTF-8 and random text from characters of
// every class the patterns tell apart.
func TestCountsMatchTiktokenGo(t *testing.T) {
	if testing.Short() {
		t.Skip("loads both encodings twice")
	}
	tiktoken.SetBpeLoader(tiktoken_loader.NewOfflineLoader()) // this test binary's only use of tiktoken-go
	texts := []string{
		"hello from ration, a rate limiter", "measure the gateway against a bare reverse proxy on one engine, please",
		"You are a helpful, pattern-following assistant that translates corporate jargon into plain English.",
		"Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage.",
		"antidisestablishmentarianism", "2 + 2 = 4", "1234567890 3.14159 -42 1e10 0x1F",
		"func main() {\n\tfmt.Println(\"héllo\")\n}\n", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":8}`,
		"<|endoftext|><|fim_prefix|><|endofprompt|>", "お誕生日おめでとう", "Ünïcödé façade naïve café", "🦀🦀 emoji 👍🏽",
		"a\u0301b\u0302 e\u0301", "non\u00a0breaking\u2028line\u0085next\u3000wide", "Ǆemal ʰaspirated ſs KELVIN",
		"\xff\xfe\x00bad utf-8 \xc3", "    indented\n\n\n    code  \r\n", strings.Repeat("ab ", 100),
	}
	alphabet := []rune("aAzZsStTrReEvVlLdDmM019 \t\n\v\f\r'/.,!-_\"{}\x00\x7féÉü語お🦀\u0301\u00a0\u0085\u2028\u3000ſKǅʰ٣")
	rng := rand.New(rand.NewPCG(3, 4))
	for range 1000 {
		var b strings.Builder
		for range rng.IntN(32) {
			b.WriteRune(alphabet[rng.IntN(len(alphabet))])
		}
		if rng.IntN(20) == 0 {
			b.WriteByte(0xff) // invalid UTF-8
		}
		texts = append(texts, b.String())
	}
	ctx := context.Background()
	for _, enc := range []struct{ model, name string }{{"gpt-4", tiktoken.MODEL_CL100K_BASE}, {"gpt-4o", tiktoken.MODEL_O200K_BASE}} {
		tk, err := tiktoken.GetEncoding(enc.name)
		if err != nil {
			t.Fatal(err)
		}
		for _, text := range texts {
			want := int64(len(tk.EncodeOrdinary(text)))
			if got, err := shared.CountTokens(ctx, enc.model, text); err != nil || got != want {
				t.Errorf("%s: CountTokens(%q) = %d, %v; tiktoken-go encodes %d tokens", enc.name, text, got, err, want)
			}
		}
	}
}
