package gateway_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/gateway"
)

func TestParseKeys(t *testing.T) {
	kr, err := gateway.ParseKeys(strings.NewReader(`[
		{"key": "sk-a", "id": "team-a", "tenant": "acme", "rpm": 60, "tpm": 90000},
		{"key": "sk-b", "id": "team-b", "rpm": 0, "tpm": 100}
	]`))
	if err != nil {
		t.Fatal(err)
	}
	if kr.Len() != 2 || strings.Join(kr.IDs(), ",") != "team-a,team-b" {
		t.Errorf("Len %d IDs %v", kr.Len(), kr.IDs())
	}
	k, ok := kr.Lookup("sk-a")
	if !ok || k.ID != "team-a" || k.Tenant != "acme" || k.Limits() != (ration.Limits{RPM: 60, TPM: 90000}) {
		t.Errorf("Lookup(sk-a) = %+v, %v", k, ok)
	}
	if p := k.Principal(); p.KeyID != "team-a" || p.Tenant != "acme" || p.Limits.TPM != 90000 {
		t.Errorf("Principal %+v", p)
	}
	if _, ok := kr.Lookup("sk-c"); ok {
		t.Error("an unknown secret was found")
	}
	if _, ok := kr.Lookup(""); ok {
		t.Error("the empty secret was found")
	}
}

func TestParseKeysRejects(t *testing.T) {
	const secret = "sk-very-secret-value"
	tests := []struct{ name, file, want string }{
		{"not JSON", `{`, "not a JSON array"},
		{"object, not array", `{"key":"x","id":"y"}`, "not a JSON array"},
		{"empty", `[]`, "no keys"},
		{"typo in a field", `[{"key":"sk-a","id":"a","rpms":5}]`, `unknown field "rpms"`},
		{"missing key", `[{"id":"a","rpm":0,"tpm":0}]`, `"key" is missing`},
		{"missing id", `[{"key":"sk-a","rpm":0,"tpm":0}]`, `"id" is missing`},
		{"space in key", `[{"key":"sk a","id":"a","rpm":0,"tpm":0}]`, "whitespace"},
		{"negative rpm", `[{"key":"sk-a","id":"a","rpm":-1,"tpm":0}]`, `entry 0 (id "a"): "rpm": -1 outside [0, 1000000000000]`},
		{"negative tpm", `[{"key":"sk-a","id":"a","rpm":0,"tpm":-5}]`, `"tpm": -5 outside`},
		{"rpm above the protocol's bound", `[{"key":"sk-a","id":"a","rpm":1000000000001,"tpm":0}]`, `"rpm": 1000000000001 outside [0, 1000000000000]`},
		{"string rpm", `[{"key":"sk-a","id":"a","rpm":"60"}]`, "not a JSON array"},
		{"duplicate id", `[{"key":"sk-a","id":"a","rpm":0,"tpm":0},{"key":"sk-b","id":"a","rpm":0,"tpm":0}]`, "entry 1 (id \"a\"): id also used by entry 0"},
		{"duplicate secret", `[{"key":"` + secret + `","id":"a","rpm":0,"tpm":0},{"key":"` + secret + `","id":"b","rpm":0,"tpm":0}]`, "same secret"},
		{"long id", `[{"key":"sk-a","id":"` + strings.Repeat("i", 257) + `","rpm":0,"tpm":0}]`, `"id": key id is 257 bytes, at most 256`},
		{"trailing data", `[{"key":"sk-a","id":"a","rpm":0,"tpm":0}] []`, "line 1, column 43: data after"},
		{"missing rpm", `[{"key":"sk-a","id":"a","tpm":5}]`, `entry 0: "rpm" is missing; write 0 for unlimited`},
		{"missing tpm", `[{"key":"sk-a","id":"a","rpm":5}]`, `entry 0: "tpm" is missing; write 0 for unlimited`},
		{"JSON error names its position", "[\n  {\"key\":\"sk-a\",\n   \"id\": }]", "line 3, column"},
	}
	for _, tt := range tests {
		_, err := gateway.ParseKeys(strings.NewReader(tt.file))
		if !errors.Is(err, gateway.ErrInvalidKeys) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want ErrInvalidKeys containing %q", tt.name, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error echoes a secret: %v", tt.name, err)
		}
	}
}

func TestLoadKeys(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.json")
	if err := os.WriteFile(path, []byte(`[{"key":"sk-a","id":"a","rpm":1,"tpm":0}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	if kr, err := gateway.LoadKeys(path); err != nil || kr.Len() != 1 {
		t.Errorf("LoadKeys: %v", err)
	}
	if _, err := gateway.LoadKeys(filepath.Join(dir, "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad.json")
	_ = os.WriteFile(bad, []byte(`[{"key":"sk-a"}]`), 0o600)
	if _, err := gateway.LoadKeys(bad); !errors.Is(err, gateway.ErrInvalidKeys) || !strings.Contains(err.Error(), bad) {
		t.Errorf("bad file: %v, want the path and ErrInvalidKeys", err)
	}
}

func TestDemoKeysAreValid(t *testing.T) {
	kr, err := gateway.NewKeyring(gateway.DemoKeys())
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := kr.Lookup("sk-ration-demo-small"); !ok || k.RPM != 3 {
		t.Errorf("demo-small = %+v, %v", k, ok)
	}
}
