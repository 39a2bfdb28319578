package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/spender/spenderhttp"
)

// maxSecretBytes is the longest API key accepted.
const maxSecretBytes = 1024

// maxKeysFileBytes caps how much of a keys file is read: 64 MiB.
const maxKeysFileBytes = 64 << 20

// Key is one API key as the keys file holds it:
//
//	{"key": "sk-...", "id": "team-a-prod", "tenant": "team-a", "rpm": 60, "tpm": 90000}
//
// Key is the secret a client sends as "Authorization: Bearer <key>". ID
// names the budget: two keys with different IDs never share one. Tenant
// is informational. RPM (requests per minute) and TPM (tokens per minute)
// are the key's global budgets; 0 means unlimited in that dimension.
type Key struct {
	Key    string `json:"key"`
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	RPM    int64  `json:"rpm"`
	TPM    int64  `json:"tpm"`
}

// Limits returns the key's budgets for the limiter: capacity one minute's
// worth, refilled continuously.
func (k Key) Limits() ration.Limits { return ration.Limits{RPM: k.RPM, TPM: k.TPM} }

// Principal returns the caller the limit stage sees for this key.
func (k Key) Principal() spenderhttp.Principal {
	return spenderhttp.Principal{KeyID: k.ID, Tenant: k.Tenant, Limits: k.Limits()}
}

// DemoKeys returns the keys the demo starts with when no keys file is
// given. Their secrets are public: never use them outside a demo.
//
//	sk-ration-demo-small   id demo-small   rpm 3     tpm 1000     a 429 within four calls
//	sk-ration-demo-medium  id demo-medium  rpm 60    tpm 6000
//	sk-ration-demo-large   id demo-large   rpm 6000  tpm 1000000  for load
func DemoKeys() []Key {
	return []Key{
		{Key: "sk-ration-demo-small", ID: "demo-small", Tenant: "demo", RPM: 3, TPM: 1000},
		{Key: "sk-ration-demo-medium", ID: "demo-medium", Tenant: "demo", RPM: 60, TPM: 6000},
		{Key: "sk-ration-demo-large", ID: "demo-large", Tenant: "demo", RPM: 6000, TPM: 1_000_000},
	}
}

// Keyring is a validated set of keys, looked up by secret. Make one with
// NewKeyring, ParseKeys or LoadKeys. It is immutable and safe for
// concurrent use.
type Keyring struct {
	// bySecret maps the SHA-256 of each secret to its key, so lookups
	// hash the presented secret instead of comparing it byte by byte.
	bySecret map[[sha256.Size]byte]Key
	ids      []string // key IDs in file order
}

// NewKeyring validates keys and returns them as a Keyring. Each key needs
// a secret (1 to 1024 bytes, no whitespace or control characters) and an
// ID (1 to 512 bytes); secrets and IDs must be unique, and rpm and tpm
// must be at least 0. An empty list is an error. Errors wrap
// ErrInvalidKeys and name the entry by position and ID, never by secret.
func NewKeyring(keys []Key) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no keys", ErrInvalidKeys)
	}
	kr := &Keyring{bySecret: make(map[[sha256.Size]byte]Key, len(keys)), ids: make([]string, 0, len(keys))}
	seenID := make(map[string]int, len(keys))
	for i, k := range keys {
		where := fmt.Sprintf("entry %d", i)
		if k.ID != "" {
			where += fmt.Sprintf(" (id %q)", k.ID)
		}
		if err := validateKey(k); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrInvalidKeys, where, err)
		}
		if j, dup := seenID[k.ID]; dup {
			return nil, fmt.Errorf("%w: %s: id also used by entry %d; two keys with one id would share a budget", ErrInvalidKeys, where, j)
		}
		seenID[k.ID] = i
		h := sha256.Sum256([]byte(k.Key))
		if _, dup := kr.bySecret[h]; dup {
			return nil, fmt.Errorf("%w: %s: the same secret appears in an earlier entry", ErrInvalidKeys, where)
		}
		kr.bySecret[h] = k
		kr.ids = append(kr.ids, k.ID)
	}
	return kr, nil
}

func validateKey(k Key) error {
	switch {
	case k.Key == "":
		return errors.New(`"key" is missing or empty`)
	case len(k.Key) > maxSecretBytes:
		return fmt.Errorf(`"key" is %d bytes; at most %d`, len(k.Key), maxSecretBytes)
	case strings.IndexFunc(k.Key, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return errors.New(`"key" contains whitespace or control characters; it could not be sent as a bearer token`)
	case k.ID == "":
		return errors.New(`"id" is missing or empty`)
	}
	if err := ration.ValidKey(k.ID); err != nil {
		return fmt.Errorf(`"id": %w`, err)
	}
	// The same bounds the limiter and the allocator enforce, so a key the
	// allocator would refuse is refused here, when the file is loaded.
	var le *ration.LimitsError
	if err := k.Limits().Validate(); errors.As(err, &le) {
		return fmt.Errorf("%q: %s (0 = unlimited)", le.Field, le.Reason)
	}
	return nil
}

// ParseKeys reads a keys file: a JSON array of Key objects. Unknown
// fields are errors (a typo like "rpms" must not silently mean
// unlimited), and so are a missing "rpm" or "tpm" (write 0 for unlimited)
// and anything after the array. A JSON error names its line and column.
// See NewKeyring for the other rules.
func ParseKeys(r io.Reader) (*Keyring, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxKeysFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: reading: %w", ErrInvalidKeys, err)
	}
	if len(data) > maxKeysFileBytes {
		return nil, fmt.Errorf("%w: over %d bytes", ErrInvalidKeys, maxKeysFileBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	// rpm and tpm are pointers here so that a missing one is an error, not
	// a silent 0 (unlimited).
	var raw []struct {
		Key    string `json:"key"`
		ID     string `json:"id"`
		Tenant string `json:"tenant"`
		RPM    *int64 `json:"rpm"`
		TPM    *int64 `json:"tpm"`
	}
	if err := dec.Decode(&raw); err != nil {
		off := dec.InputOffset()
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syn):
			off = syn.Offset
		case errors.As(err, &typ):
			off = typ.Offset
		}
		return nil, fmt.Errorf("%w: %s: not a JSON array of {\"key\",\"id\",\"tenant\",\"rpm\",\"tpm\"} objects: %w",
			ErrInvalidKeys, position(data, off), err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: %s: data after the JSON array", ErrInvalidKeys, position(data, dec.InputOffset()))
	}
	keys := make([]Key, len(raw))
	for i, k := range raw {
		switch {
		case k.RPM == nil:
			return nil, fmt.Errorf("%w: entry %d: \"rpm\" is missing; write 0 for unlimited", ErrInvalidKeys, i)
		case k.TPM == nil:
			return nil, fmt.Errorf("%w: entry %d: \"tpm\" is missing; write 0 for unlimited", ErrInvalidKeys, i)
		}
		keys[i] = Key{Key: k.Key, ID: k.ID, Tenant: k.Tenant, RPM: *k.RPM, TPM: *k.TPM}
	}
	return NewKeyring(keys)
}

// position is "line L, column C" of byte offset off in data (both from 1).
func position(data []byte, off int64) string {
	off = min(max(off, 0), int64(len(data)))
	before := data[:off]
	line := bytes.Count(before, []byte("\n")) + 1
	col := int(off) - (bytes.LastIndexByte(before, '\n') + 1) + 1
	return fmt.Sprintf("line %d, column %d", line, col)
}

// LoadKeys reads the keys file at path; see ParseKeys.
func LoadKeys(path string) (*Keyring, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gateway: keys file: %w", err)
	}
	defer f.Close()
	kr, err := ParseKeys(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return kr, nil
}

// Lookup returns the key whose secret is secret and reports whether there
// is one.
func (kr *Keyring) Lookup(secret string) (Key, bool) {
	k, ok := kr.bySecret[sha256.Sum256([]byte(secret))]
	return k, ok
}

// Len returns the number of keys.
func (kr *Keyring) Len() int { return len(kr.ids) }

// IDs returns the key IDs in the order they were given.
func (kr *Keyring) IDs() []string { return append([]string(nil), kr.ids...) }
