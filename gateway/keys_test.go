package gateway_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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
		{"string rpm", `[{"key":"sk-a","id":"a","rpm":"60"}]`, `line 1, column 25: entry 0 (id "a"): "rpm": got a JSON string, want a whole number`},
		{"duplicate id", `[{"key":"sk-a","id":"a","rpm":0,"tpm":0},{"key":"sk-b","id":"a","rpm":0,"tpm":0}]`, "entry 1 (id \"a\"): id also used by entry 0"},
		{"duplicate secret", `[{"key":"` + secret + `","id":"a","rpm":0,"tpm":0},{"key":"` + secret + `","id":"b","rpm":0,"tpm":0}]`, "same secret"},
		{"long id", `[{"key":"sk-a","id":"` + strings.Repeat("i", 257) + `","rpm":0,"tpm":0}]`, `"id": key id is 257 bytes, at most 256`},
		{"trailing data", `[{"key":"sk-a","id":"a","rpm":0,"tpm":0}] []`, "line 1, column 43: data after"},
		{"missing rpm", `[{"key":"sk-a","id":"a","tpm":5}]`, `line 1, column 2: entry 0 (id "a"): "rpm" is missing; write 0 for unlimited`},
		{"missing tpm", `[{"key":"sk-a","id":"a","rpm":5}]`, `entry 0 (id "a"): "tpm" is missing; write 0 for unlimited`},
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

// TestParseKeysLocatesMistakes: every refusal of a file names the line
// and column, and the entry, id and field when one entry is at fault, as
// a *KeysError.
func TestParseKeysLocatesMistakes(t *testing.T) {
	const file = `[
  {"key": "sk-a", "id": "a", "tenant": "t", "rpm": 60, "tpm": 0},
  {"key": "sk-b", "id": "b",
   "tenant": "t",
   %s}
]`
	tests := []struct {
		name, entry           string
		line, col, index      int
		id, field, msg, notIn string
	}{
		{"invalid limit", `"rpm": -5, "tpm": 0`, 5, 4, 1, "b", "rpm", `"rpm": -5 outside [0, 1000000000000]`, ""},
		{"limit above the bound", `"rpm": 0, "tpm": 1000000000001`, 5, 14, 1, "b", "tpm", `"tpm": 1000000000001 outside`, ""},
		{"string limit", `"rpm": "60", "tpm": 0`, 5, 4, 1, "b", "rpm", `"rpm": got a JSON string, want a whole number`, ""},
		{"fraction", `"rpm": 1.5, "tpm": 0`, 5, 4, 1, "b", "rpm", `"rpm": got a JSON number 1.5`, ""},
		{"unknown field", `"rpm": 1, "tpms": 0`, 5, 14, 1, "b", "tpms", `unknown field "tpms"`, ""},
		{"field name in another case", `"rpm": 1, "TPM": -1`, 5, 14, 1, "b", "tpm", `"tpm": -1 outside`, ""},
		{"missing tpm", `"rpm": 1`, 3, 3, 1, "b", "tpm", `"tpm" is missing; write 0 for unlimited`, ""},
		{"syntax error", `"rpm": 1, "tpm": }`, 5, 21, 1, "", "", `invalid character '}' looking for beginning of value`, ""},
		{"missing comma", `"rpm": 1 "tpm": 0`, 5, 13, 1, "", "", `after object key:value pair`, ""},
		{"duplicate id", `"rpm": 1, "tpm": 0, "id": "a"`, 5, 24, 1, "a", "id", "id also used by entry 0", ""},
		{"secret with a space", `"rpm": 1, "tpm": 0, "key": "sk b"`, 5, 24, 1, "b", "key", "whitespace", "sk b"},
		// Not rewritten to "bad\ufffd\ufffdid": refused at the first bad byte.
		{"id not UTF-8", "\"rpm\": 1, \"tpm\": 0, \"id\": \"bad\xff\xfeid\"", 5, 34, 1, "bad\ufffd\ufffdid", "id", "bytes that are not UTF-8", ""},
	}
	for _, tt := range tests {
		_, err := gateway.ParseKeys(strings.NewReader(fmt.Sprintf(file, tt.entry)))
		var ke *gateway.KeysError
		if !errors.As(err, &ke) || !errors.Is(err, gateway.ErrInvalidKeys) {
			t.Errorf("%s: error %v, want a *KeysError wrapping ErrInvalidKeys", tt.name, err)
			continue
		}
		if ke.Line != tt.line || ke.Column != tt.col || ke.Entry != tt.index || ke.ID != tt.id || ke.Field != tt.field {
			t.Errorf("%s: line %d column %d entry %d id %q field %q, want %d %d %d %q %q (%v)", tt.name,
				ke.Line, ke.Column, ke.Entry, ke.ID, ke.Field, tt.line, tt.col, tt.index, tt.id, tt.field, err)
		}
		want := fmt.Sprintf("line %d, column %d: entry %d", tt.line, tt.col, tt.index)
		if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: %q, want it to contain %q and %q", tt.name, err, want, tt.msg)
		}
		if tt.notIn != "" && strings.Contains(err.Error(), tt.notIn) {
			t.Errorf("%s: the error echoes a secret: %v", tt.name, err)
		}
	}
	// Mistakes that are not one entry's: located, no entry.
	for _, tt := range []struct {
		file      string
		line, col int
		msg       string
	}{
		{"", 1, 1, "unexpected end of JSON input"},
		{"\n  {\"key\": \"sk-a\"}", 2, 3, "not a JSON array"},
		{"[\n]", 0, 0, "no keys"},
		{"[{\"key\":\"sk-a\",\"id\":\"a\",\"rpm\":0,\"tpm\":0}]\n[]", 2, 1, "data after the JSON array"},
		{"{\"keys\": [{\"key\":\"sk-a\",\"id\":\"a\",\"rpm\":0,\"tpm\":0}],\n \"tenants\": {\"t\xff\": {\"rpm\": 1}}}", 2, 16, "bytes that are not UTF-8"},
	} {
		_, err := gateway.ParseKeys(strings.NewReader(tt.file))
		var ke *gateway.KeysError
		if !errors.As(err, &ke) || ke.Entry != -1 || ke.Line != tt.line || ke.Column != tt.col || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%q: %v (%+v), want line %d column %d, no entry, %q", tt.file, err, ke, tt.line, tt.col, tt.msg)
		}
	}
}

// TestParseKeysLocatesTableMistakes: a mistake in an entry of "tenants"
// or "models" is located at the rate at fault in that entry, else at the
// entry's name, and names the entry and the rate.
func TestParseKeysLocatesTableMistakes(t *testing.T) {
	const file = `{
  "keys": [{"key": "sk-a", "id": "a", "tenant": "acme", "rpm": 60, "tpm": 0}],
  "tenants": {
    %s
  },
  "models": {
    %s
  }
}`
	const ok = `"fine": {}`
	tests := []struct {
		name, tenants, models string
		line, col             int
		field, msg            string
	}{
		{"tenant rate out of bounds", `"acme": {"rpm": 1, "tpd": -5}`, ok, 4, 24, "tpd", `tenants["acme"]: "tpd": -5 outside [0, 1000000000000]`},
		{"tenant unknown rate", `"acme": {"rpms": 1}`, ok, 4, 14, "rpms", `tenants["acme"]: unknown field "rpms"`},
		{"model rate above the bound", ok, `"m": {"tpm": 1, "otpm": 1000000000001}`, 7, 21, "otpm", `models["m"]: "otpm": 1000000000001 outside`},
		{"empty model name", ok, `"": {"tpm": 5}`, 7, 5, "models", `models[""]: empty name`},
		{"unknown rate", ok, `"m": {"tpm": 1, "tpms": 5}`, 7, 21, "tpms", `models["m"]: unknown field "tpms"`},
		{"string rate", ok, `"m": {"tpm": "5"}`, 7, 11, "tpm", `models["m"]: "tpm": got a JSON string, want a whole number`},
		{"fraction", ok, `"m": {"tpm": 1.5}`, 7, 11, "tpm", `models["m"]: "tpm": got a JSON number 1.5, want a whole number`},
		{"rate name in another case", ok, `"m": {"TPM": -1}`, 7, 11, "tpm", `models["m"]: "tpm": -1 outside`},
		{"entry not an object", ok, `"m": [1]`, 7, 5, "models", `models["m"]: the entry is a JSON array`},
		{"repeated name: the last counts", ok, `"m": {"tpm": 1}, "m": {"tpm": -1}`, 7, 28, "tpm", `models["m"]: "tpm": -1 outside`},
	}
	for _, tt := range tests {
		_, err := gateway.ParseKeys(strings.NewReader(fmt.Sprintf(file, tt.tenants, tt.models)))
		var ke *gateway.KeysError
		if !errors.As(err, &ke) || !errors.Is(err, gateway.ErrInvalidKeys) {
			t.Errorf("%s: error %v, want a *KeysError wrapping ErrInvalidKeys", tt.name, err)
			continue
		}
		if ke.Line != tt.line || ke.Column != tt.col || ke.Entry != -1 || ke.ID != "" || ke.Field != tt.field {
			t.Errorf("%s: line %d column %d entry %d id %q field %q, want %d %d -1 \"\" %q (%v)", tt.name,
				ke.Line, ke.Column, ke.Entry, ke.ID, ke.Field, tt.line, tt.col, tt.field, err)
		}
		if want := fmt.Sprintf("line %d, column %d: ", tt.line, tt.col); !strings.Contains(err.Error(), want+tt.msg) {
			t.Errorf("%s: %q, want it to contain %q", tt.name, err, want+tt.msg)
		}
	}
	// A table that is not an object is located at its name, as before.
	_, err := gateway.ParseKeys(strings.NewReader(`{
  "keys": [{"key": "sk-a", "id": "a", "tenant": "acme", "rpm": 60, "tpm": 0}],
  "models": []
}`))
	var ke *gateway.KeysError
	if !errors.As(err, &ke) || ke.Line != 3 || ke.Column != 3 || ke.Field != "models" || !strings.Contains(err.Error(), `"models": json: cannot unmarshal array`) {
		t.Errorf("models as an array: %v (%+v), want line 3 column 3, field models", err, ke)
	}
}

// TestCurrentKeysFilesStillLoad: the files documented before reloading
// existed load unchanged.
func TestCurrentKeysFilesStillLoad(t *testing.T) {
	kr, err := gateway.ParseKeys(strings.NewReader(`[
  {"key": "sk-team-a-0f3c", "id": "team-a-prod", "tenant": "team-a", "rpm": 60,  "tpm": 90000},
  {"key": "sk-batch-77aa",  "id": "batch",       "tenant": "team-b", "rpm": 0,   "tpm": 2000000}
]`))
	if err != nil || kr.Len() != 2 {
		t.Fatalf("the documented example: %v", err)
	}
	b, err := json.Marshal(gateway.DemoKeys()) // what the demo's tests write
	if err != nil {
		t.Fatal(err)
	}
	if kr, err := gateway.ParseKeys(bytes.NewReader(b)); err != nil || kr.Len() != 3 {
		t.Fatalf("json.Marshal([]Key): %v", err)
	}
}
