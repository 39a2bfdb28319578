package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/rationhq/ration/gateway"
)

// banner prints what runs where, the API keys and curl lines to try.
func (f *fleet) banner(w io.Writer) {
	if w == nil {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ration gateway-demo: %d gateway instance(s) sharing each API key's budget through leases\n\n", len(f.instances))
	for i, inst := range f.instances {
		fmt.Fprintf(&b, "  gateway %-2d  %s/v1   metrics %s/metrics\n", i+1, inst.url, inst.url)
	}
	engine := "echo (replies with your prompt; a token is a word)"
	if f.engine == nil {
		engine = "upstream"
	}
	fmt.Fprintf(&b, "  engine      %s   %s\n", f.engineURL, engine)
	fmt.Fprintf(&b, "  allocator   %s\n", f.source.desc)
	fmt.Fprintf(&b, "  prompts     counted by %s (-tokenizer %s)\n\n", f.tokenizerDesc(), f.cfg.tokenizer)

	key, small := "$RATION_KEY", gateway.Key{}
	if f.demoKeys {
		b.WriteString("API keys (built-in demo keys; their budgets are global across the instances):\n")
		for _, k := range gateway.DemoKeys() {
			fmt.Fprintf(&b, "  %-24s id %-12s %5d RPM  %8d TPM\n", k.Key, k.ID, k.RPM, k.TPM)
		}
		small = gateway.DemoKeys()[0]
		key = small.Key
	} else {
		kr := f.keys.Current()
		fmt.Fprintf(&b, "API keys: %d from %s (ids %s); set RATION_KEY to one of them.\n", kr.Len(), f.cfg.keysFile, strings.Join(kr.IDs(), ", "))
		reload := "edit it and send SIGHUP (kill -HUP " + strconv.Itoa(os.Getpid()) + ")"
		if f.cfg.keysReload > 0 {
			reload = fmt.Sprintf("edits are loaded within %v, or at once on SIGHUP (kill -HUP %d)", f.cfg.keysReload, os.Getpid())
		}
		fmt.Fprintf(&b, "  The file is live: %s; a file that does not validate is refused, logged, and the keys in force stay.\n", reload)
	}
	first, last := f.instances[0].url, f.instances[len(f.instances)-1].url
	loop := []string{first, first, last, last}
	body := `{"model":"echo","messages":[{"role":"user","content":"hello from ration"}],"max_tokens":16}`
	fmt.Fprintf(&b, "\nA request, with its rate-limit headers:\n  curl -sS -i %s/v1/chat/completions -H \"Authorization: Bearer %s\" -H 'Content-Type: application/json' -d '%s'\n", first, key, body)
	if f.demoKeys {
		fmt.Fprintf(&b, "\nSpend the key's %d RPM; the budget is global, so the other instance answers 429 with Retry-After:\n", small.RPM)
	} else {
		b.WriteString("\nSpend a key until it gets 429 with Retry-After; the budget is global across the instances:\n")
	}
	fmt.Fprintf(&b, "  for u in %s; do curl -sS -o /dev/null -D - $u/v1/chat/completions -H \"Authorization: Bearer %s\" -H 'Content-Type: application/json' -d '%s' | grep -iE '^(HTTP/|retry-after|x-ratelimit-remaining-requests)'; done\n",
		strings.Join(loop, " "), key, body)
	streamKey := key
	if f.demoKeys {
		streamKey = gateway.DemoKeys()[1].Key // not the small key the loop just spent
	}
	stream := `{"model":"echo","stream":true,"messages":[{"role":"user","content":"streamed one word at a time"}]}`
	fmt.Fprintf(&b, "\nStreaming:\n  curl -sS -N %s/v1/chat/completions -H \"Authorization: Bearer %s\" -H 'Content-Type: application/json' -d '%s'\n", last, streamKey, stream)
	b.WriteString("\nCtrl-C stops the demo and returns every lease to the allocator.\n")
	_, _ = io.WriteString(w, b.String())
}
