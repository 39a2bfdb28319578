package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

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
// names the tenant whose budget (the file's "tenants") the key shares, if
// it has one. RPM (requests per minute) and TPM (tokens per minute) are
// the key's global budgets; 0 means unlimited in that dimension.
//
// The other fields are optional (see Rates): input and output tokens per
// minute, requests and tokens per day, and limits per model, each a
// budget of its own that a request is charged to with the others, all or
// nothing.
type Key struct {
	Key    string `json:"key"`
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	RPM    int64  `json:"rpm"`
	TPM    int64  `json:"tpm"`

	ITPM   int64            `json:"itpm,omitempty"`   // input tokens per minute
	OTPM   int64            `json:"otpm,omitempty"`   // output tokens per minute
	RPD    int64            `json:"rpd,omitempty"`    // requests per day
	TPD    int64            `json:"tpd,omitempty"`    // tokens per day
	Models map[string]Rates `json:"models,omitempty"` // the key's limits on each model, by the request's "model"
}

// rates is k's own limits as Rates.
func (k Key) rates() Rates {
	return Rates{RPM: k.RPM, TPM: k.TPM, ITPM: k.ITPM, OTPM: k.OTPM, RPD: k.RPD, TPD: k.TPD}
}

// Limits returns the key's budgets for the limiter: capacity one minute's
// worth, refilled continuously.
func (k Key) Limits() ration.Limits { return ration.Limits{RPM: k.RPM, TPM: k.TPM} }

// Principal returns the caller the limit stage sees for this key, with
// the key's own budgets; a Keyring's adds its tenant's and its models'
// (see Keyring.Principal).
func (k Key) Principal() spenderhttp.Principal {
	return principalOf(k, nil)
}

// principalOf is k's Principal under the tables of a keys file (nil: k's
// own budgets only). Budget ids: the key's own extras "<id>/in", "/out",
// "/day"; its tenant's "tenant:<name>" (and "/in", ...); its limits on a
// model "<id>@<model>"; a model's cap "model:<model>".
func principalOf(k Key, t *tables) spenderhttp.Principal {
	p := spenderhttp.Principal{KeyID: k.ID, Tenant: k.Tenant, Limits: k.Limits()}
	p.Budgets = k.rates().spend(k.ID, "key", true)
	if t != nil && k.Tenant != "" {
		if r, ok := t.Tenants[k.Tenant]; ok {
			p.Budgets = append(p.Budgets, r.spend("tenant:"+k.Tenant, "tenant", false)...)
		}
	}
	models := map[string][]spenderhttp.Budget{}
	for _, m := range sortedNames(k.Models) {
		models[m] = append(models[m], k.Models[m].spend(k.ID+"@"+m, "key-model", false)...)
	}
	if t != nil {
		for _, m := range sortedNames(t.Models) {
			models[m] = append(models[m], t.Models[m].spend("model:"+m, "model", false)...)
		}
	}
	if len(p.Budgets) == 0 {
		p.Budgets = nil
	}
	if len(models) > 0 {
		p.Models = models
	}
	return p
}

// tables are a keys file's budgets that are not one key's: each tenant's,
// shared by its keys, and each model's cap, shared by every key.
type tables struct {
	Tenants map[string]Rates `json:"tenants"`
	Models  map[string]Rates `json:"models"`
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
	bySecret map[[sha256.Size]byte]entry
	ids      []string // key IDs in file order
}

// entry is one key and the Principal it authenticates as.
type entry struct {
	key Key
	p   spenderhttp.Principal
}

// KeysError is a mistake in a list of keys, located: every error
// NewKeyring, ParseKeys and LoadKeys return for keys that cannot be used
// is one (LoadKeys wraps it with the file's path), and it wraps
// ErrInvalidKeys. Its message never contains a secret.
type KeysError struct {
	// Line and Column locate the mistake in the file (both from 1): the
	// field at fault, else the entry, else the character JSON stopped at.
	// 0 when there is no file (NewKeyring).
	Line, Column int
	// Entry is the position of the entry at fault in the array, from 0;
	// -1 when the mistake is not one entry's (not JSON, not an array, no
	// entries) or is in "tenants" or "models".
	Entry int
	// ID is the entry's id, when it has one.
	ID string
	// Field is the field at fault as the file spells it ("key", "id",
	// "tenant", "rpm", "tpm", or an unknown one); "" when it is not one
	// field's. In an entry of "tenants" or "models" it is the rate at
	// fault, or the table's name when the entry as a whole is.
	Field string
	// Err says what is wrong.
	Err error
}

// Error returns "gateway: invalid keys: line L, column C: entry I (id
// "ID"): what is wrong", leaving out the parts that are not known.
func (e *KeysError) Error() string {
	var b strings.Builder
	b.WriteString(ErrInvalidKeys.Error())
	if e.Line > 0 {
		fmt.Fprintf(&b, ": line %d, column %d", e.Line, e.Column)
	}
	if e.Entry >= 0 {
		fmt.Fprintf(&b, ": entry %d", e.Entry)
		if e.ID != "" {
			fmt.Fprintf(&b, " (id %q)", e.ID)
		}
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

// Unwrap returns ErrInvalidKeys and what is wrong.
func (e *KeysError) Unwrap() []error { return []error{ErrInvalidKeys, e.Err} }

// NewKeyring validates keys and returns them as a Keyring. Each key needs
// a secret (1 to 1024 bytes, no whitespace or control characters) and an
// ID (1 to ration.MaxKeyLen bytes of UTF-8); secrets and IDs must be
// unique, and rpm and tpm must be at least 0 and within the protocol's
// bounds. An empty list is an error. Errors are *KeysError
// (wrapping ErrInvalidKeys) and name the entry by position and ID, never
// by secret.
func NewKeyring(keys []Key) (*Keyring, error) { return newKeyring(keys, nil, nil) }

// newKeyring is NewKeyring under the file's tables t (nil: none); src,
// when not nil, is the file the keys were parsed from, to locate errors
// in.
func newKeyring(keys []Key, t *tables, src *keysSource) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, src.fail(-1, "", "", errors.New("no keys"))
	}
	if err := t.validate(); err != nil {
		return nil, src.failTable(err)
	}
	kr := &Keyring{bySecret: make(map[[sha256.Size]byte]entry, len(keys)), ids: make([]string, 0, len(keys))}
	seenID := make(map[string]int, len(keys))
	for i, k := range keys {
		if field, err := validateKey(k); err != nil {
			return nil, src.fail(i, k.ID, field, err)
		}
		if j, dup := seenID[k.ID]; dup {
			return nil, src.fail(i, k.ID, "id", fmt.Errorf("id also used by entry %d; two keys with one id would share a budget", j))
		}
		seenID[k.ID] = i
		h := sha256.Sum256([]byte(k.Key))
		if _, dup := kr.bySecret[h]; dup {
			return nil, src.fail(i, k.ID, "key", errors.New("the same secret appears in an earlier entry"))
		}
		kr.bySecret[h] = entry{key: k, p: principalOf(k, t)}
		kr.ids = append(kr.ids, k.ID)
	}
	// Every budget id must name one budget: not a key's id, and within
	// the protocol's bound.
	for i, k := range keys {
		e := kr.bySecret[sha256.Sum256([]byte(k.Key))]
		all := e.p.Budgets
		for _, m := range sortedNames(e.p.Models) {
			all = append(all, e.p.Models[m]...)
		}
		for _, b := range all {
			if err := ration.ValidKey(b.Key); err != nil {
				return nil, src.fail(i, k.ID, "id", fmt.Errorf("budget id %q: %w", b.Key, err))
			}
			if j, clash := seenID[b.Key]; clash {
				return nil, src.fail(i, k.ID, "id", fmt.Errorf("budget id %q is the id of entry %d; rename one", b.Key, j))
			}
		}
	}
	return kr, nil
}

// validateKey checks one key on its own and names the field at fault.
func validateKey(k Key) (field string, err error) {
	switch {
	case k.Key == "":
		return "key", errors.New(`"key" is missing or empty`)
	case len(k.Key) > maxSecretBytes:
		return "key", fmt.Errorf(`"key" is %d bytes; at most %d`, len(k.Key), maxSecretBytes)
	case strings.IndexFunc(k.Key, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return "key", errors.New(`"key" contains whitespace or control characters; it could not be sent as a bearer token`)
	case k.ID == "":
		return "id", errors.New(`"id" is missing or empty`)
	}
	if err := ration.ValidKey(k.ID); err != nil {
		return "id", fmt.Errorf(`"id": %w`, err)
	}
	// The same bounds the limiter and the allocator enforce, so a key the
	// allocator would refuse is refused here, when the file is loaded.
	if field, err := k.rates().validate(); err != nil {
		return field, err
	}
	for _, m := range sortedNames(k.Models) {
		if m == "" {
			return "models", errors.New(`"models" has an empty model name`)
		}
		if _, err := k.Models[m].validate(); err != nil {
			return "models", fmt.Errorf("models[%q]: %w", m, err)
		}
	}
	return "", nil
}

// validate checks the tables' names and rates.
func (t *tables) validate() error {
	if t == nil {
		return nil
	}
	for _, tab := range []struct {
		name string
		m    map[string]Rates
	}{{"tenants", t.Tenants}, {"models", t.Models}} {
		for _, n := range sortedNames(tab.m) {
			if n == "" {
				return &tableError{tab.name, n, "", errors.New("empty name")}
			}
			if field, err := tab.m[n].validate(); err != nil {
				return &tableError{tab.name, n, field, err}
			}
		}
	}
	return nil
}

// tableError is a mistake in the file's "tenants" or "models".
type tableError struct {
	table, name, field string
	err                error
}

func (e *tableError) Error() string {
	return fmt.Sprintf("%s[%q]: %v", e.table, e.name, e.err)
}

// rawKey is one entry as the file holds it. rpm and tpm are pointers so
// that a missing one is an error, not a silent 0 (unlimited); the other
// limits are optional.
type rawKey struct {
	Key    string           `json:"key"`
	ID     string           `json:"id"`
	Tenant string           `json:"tenant"`
	RPM    *int64           `json:"rpm"`
	TPM    *int64           `json:"tpm"`
	ITPM   int64            `json:"itpm"`
	OTPM   int64            `json:"otpm"`
	RPD    int64            `json:"rpd"`
	TPD    int64            `json:"tpd"`
	Models map[string]Rates `json:"models"`
}

// keysSource is a keys file being parsed: its bytes and where each entry
// starts, to turn a mistake into a *KeysError with its line and column.
// A nil *keysSource (NewKeyring) locates nothing.
type keysSource struct {
	data   []byte
	starts []int64 // byte offset of each entry decoded so far
	// rates locates each entry of the "tenants" and "models" tables: the
	// byte offsets of its name and of its object (the last one when a name
	// repeats, as in the decoded table).
	rates map[tableEntry][2]int64
}

// tableEntry names one entry of the file's "tenants" or "models".
type tableEntry struct{ table, name string }

// fail returns the *KeysError for err in entry (or -1) and field (or ""),
// located at the field if the entry has it, else at the entry.
func (s *keysSource) fail(entry int, id, field string, err error) *KeysError {
	e := &KeysError{Entry: entry, ID: id, Field: field, Err: err}
	if s != nil && entry >= 0 && entry < len(s.starts) {
		off := s.starts[entry]
		if at, ok := fieldOffset(s.data, off, field); ok {
			off = at
		}
		e.Line, e.Column = lineCol(s.data, off)
	}
	return e
}

// failAt is fail located at byte offset off.
func (s *keysSource) failAt(off int64, entry int, id, field string, err error) *KeysError {
	e := s.fail(entry, id, field, err)
	e.Line, e.Column = lineCol(s.data, off)
	return e
}

// ParseKeys reads a keys file: a JSON array of Key objects, or an object
// with that array as "keys" beside the budgets keys share:
//
//	{
//	  "keys": [{"key": "sk-a", "id": "a", "tenant": "acme", "rpm": 60, "tpm": 90000,
//	            "models": {"gpt-4o": {"tpm": 30000}}}, ...],
//	  "tenants": {"acme": {"rpm": 100, "tpm": 150000}},
//	  "models":  {"gpt-4o": {"tpm": 500000, "otpm": 100000}}
//	}
//
// "tenants" gives each tenant a budget all its keys share; "models" caps
// each model over every key. Unknown fields are errors (a typo like
// "rpms" must not silently mean unlimited), and so are a missing "rpm"
// or "tpm" in a key (write 0 for unlimited) and anything after the
// array. Errors are *KeysError: a JSON mistake names its line and
// column, a bad entry its line and column, position, id and field, a bad
// entry of "tenants" or "models" its line and column, name and field.
// See NewKeyring for the other rules.
//
// This is the one parser of keys files: LoadKeys and KeysReloader use it.
func ParseKeys(r io.Reader) (*Keyring, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxKeysFileBytes+1))
	if err != nil {
		return nil, &KeysError{Entry: -1, Err: fmt.Errorf("reading: %w", err)}
	}
	return parseKeys(data)
}

// notArray is what a file that is not an array of entries is told.
const notArray = `not a JSON array of {"key","id","tenant","rpm","tpm"} objects`

func parseKeys(data []byte) (*Keyring, error) {
	if len(data) > maxKeysFileBytes {
		return nil, &KeysError{Entry: -1, Err: fmt.Errorf("over %d bytes", maxKeysFileBytes)}
	}
	src := &keysSource{data: data}
	// Syntax first, over the whole file: the scanner locates a syntax
	// error exactly (the stream decoder below does not), and the entries
	// are then decoded from JSON known to be well formed.
	if !json.Valid(data) {
		return nil, src.syntaxError()
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var keys []Key
	var t *tables
	var err error
	switch tok, _ := dec.Token(); tok {
	case json.Delim('['):
		keys, err = src.entries(dec)
	case json.Delim('{'):
		t = &tables{}
		for dec.More() && err == nil {
			at := skipSpace(data, dec.InputOffset())
			name, _ := dec.Token()
			switch name {
			case "keys":
				if tok, _ := dec.Token(); tok != json.Delim('[') {
					return nil, src.failAt(at, -1, "", "keys", errors.New(`"keys" is not an array of {"key","id","tenant","rpm","tpm"} objects`))
				}
				keys, err = src.entries(dec)
			case "tenants", "models":
				m := &t.Tenants
				if name == "models" {
					m = &t.Models
				}
				if terr := src.table(dec, at, name.(string), m); terr != nil {
					return nil, terr
				}
			case "key", "id", "tenant", "rpm", "tpm":
				// One key's object, not in an array.
				return nil, src.failAt(skipSpace(data, 0), -1, "", "", errors.New(notArray+`, nor an object with such an array as "keys"`))
			default:
				return nil, src.failAt(at, -1, "", fmt.Sprint(name), fmt.Errorf(`unknown field %q; the file's fields are "keys", "tenants" and "models"`, name))
			}
		}
	default:
		return nil, src.failAt(skipSpace(data, 0), -1, "", "", errors.New(notArray))
	}
	if err != nil {
		return nil, err
	}
	if err := src.utf8(0, int64(len(data)), -1, ""); err != nil { // the tables
		return nil, err
	}
	return newKeyring(keys, t, src)
}

// utf8 refuses bytes that are not UTF-8 in data[from:to], part of entry
// (or -1) with id, locating the first. The JSON decoder would replace each
// with U+FFFD, silently turning one id into another.
func (s *keysSource) utf8(from, to int64, entry int, id string) *KeysError {
	b := s.data[from:to]
	if utf8.Valid(b) {
		return nil
	}
	off := 0
	for off < len(b) {
		r, n := utf8.DecodeRune(b[off:])
		if r == utf8.RuneError && n <= 1 {
			break
		}
		off += n
	}
	field := ""
	if entry >= 0 {
		field = fieldAt(s.data, from, from+int64(off))
	}
	return s.failAt(from+int64(off), entry, id, field, errors.New("bytes that are not UTF-8 (a JSON file is UTF-8; ids travel as protobuf strings)"))
}

// entries decodes the entries of the keys array dec is inside, and its
// closing bracket.
func (src *keysSource) entries(dec *json.Decoder) ([]Key, error) {
	data := src.data
	var keys []Key
	for i := 0; dec.More(); i++ {
		src.starts = append(src.starts, skipSpace(data, dec.InputOffset()))
		var k rawKey
		if err := dec.Decode(&k); err != nil {
			return nil, src.decodeError(i, k.ID, err)
		}
		if err := src.utf8(src.starts[i], dec.InputOffset(), i, k.ID); err != nil {
			return nil, err
		}
		switch {
		case k.RPM == nil:
			return nil, src.fail(i, k.ID, "rpm", errors.New(`"rpm" is missing; write 0 for unlimited`))
		case k.TPM == nil:
			return nil, src.fail(i, k.ID, "tpm", errors.New(`"tpm" is missing; write 0 for unlimited`))
		}
		keys = append(keys, Key{Key: k.Key, ID: k.ID, Tenant: k.Tenant, RPM: *k.RPM, TPM: *k.TPM,
			ITPM: k.ITPM, OTPM: k.OTPM, RPD: k.RPD, TPD: k.TPD, Models: k.Models})
	}
	_, err := dec.Token() // the closing bracket
	return keys, err
}

// table decodes the "tenants" or "models" table dec is at (its name at
// offset at) into *m, one entry at a time, so that a mistake in an entry
// is located there, and records where each entry is (for failTable).
func (s *keysSource) table(dec *json.Decoder, at int64, table string, m *map[string]Rates) error {
	if off := skipSpace(s.data, dec.InputOffset()); off >= int64(len(s.data)) || s.data[off] != '{' {
		// Not an object: null (nothing), or a mistake the decoder names.
		if err := dec.Decode(m); err != nil {
			return s.failAt(at, -1, "", table, fmt.Errorf("%q: %w", table, err))
		}
		return nil
	}
	_, _ = dec.Token() // the opening brace
	if *m == nil {
		*m = map[string]Rates{}
	}
	if s.rates == nil {
		s.rates = map[tableEntry][2]int64{}
	}
	for dec.More() {
		nameAt := skipSpace(s.data, dec.InputOffset())
		tok, _ := dec.Token()
		name, _ := tok.(string) // well-formed JSON: an object's names are strings
		valueAt := skipSpace(s.data, dec.InputOffset())
		var r Rates
		if err := dec.Decode(&r); err != nil {
			return s.rateDecodeError(table, name, nameAt, valueAt, err)
		}
		(*m)[name] = r
		s.rates[tableEntry{table, name}] = [2]int64{nameAt, valueAt}
	}
	_, err := dec.Token() // the closing brace
	return err
}

// rateDecodeError is the *KeysError for err, met decoding the entry name
// of table, whose name is at nameAt and object at valueAt. The JSON is
// well formed, so err is a type mismatch or an unknown field.
func (s *keysSource) rateDecodeError(table, name string, nameAt, valueAt int64, err error) *KeysError {
	e := &KeysError{Entry: -1, Field: table, Err: fmt.Errorf("%s[%q]: %w", table, name, err)}
	at := nameAt
	var typ *json.UnmarshalTypeError
	if errors.As(err, &typ) {
		if typ.Field == "" {
			e.Err = fmt.Errorf(`%s[%q]: the entry is a JSON %s; want an object of rates {"rpm","tpm",...}`, table, name, typ.Value)
		} else {
			e.Field = typ.Field
			e.Err = fmt.Errorf("%s[%q]: %q: got a JSON %s, want a whole number (0 = unlimited)", table, name, typ.Field, typ.Value)
			if f, ok := fieldOffset(s.data, valueAt, typ.Field); ok {
				at = f
			}
		}
	} else if quoted, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if field, uerr := strconv.Unquote(quoted); uerr == nil {
			e.Field = field
			e.Err = fmt.Errorf(`%s[%q]: unknown field %q; the fields are "rpm", "tpm", "itpm", "otpm", "rpd" and "tpd"`, table, name, field)
			if f, ok := fieldOffsetExact(s.data, valueAt, field); ok {
				at = f
			}
		}
	}
	e.Line, e.Column = lineCol(s.data, at)
	return e
}

// failTable is the *KeysError for a mistake in the file's tables, located
// at the field at fault in the table's entry, else at the entry's name,
// when the entry can be found.
func (s *keysSource) failTable(err error) *KeysError {
	te, ok := err.(*tableError)
	if !ok {
		return &KeysError{Entry: -1, Err: err}
	}
	e := &KeysError{Entry: -1, Field: te.table, Err: err}
	if te.field != "" {
		e.Field = te.field
	}
	if s == nil {
		return e
	}
	where, found := s.rates[tableEntry{te.table, te.name}]
	if !found {
		return e
	}
	at := where[0]
	if te.field != "" {
		if f, ok := fieldOffset(s.data, where[1], te.field); ok {
			at = f
		}
	}
	e.Line, e.Column = lineCol(s.data, at)
	return e
}

// syntaxError locates the first syntax error of s.data, which is not
// valid JSON.
func (s *keysSource) syntaxError() *KeysError {
	err := json.Unmarshal(s.data, new(json.RawMessage))
	var syn *json.SyntaxError
	if !errors.As(err, &syn) {
		return &KeysError{Entry: -1, Err: fmt.Errorf("%s: %w", notArray, err)}
	}
	// Offset counts the bytes read, the offending one included; at the
	// end of the input it is the input's length.
	off := syn.Offset
	if off > 0 && off <= int64(len(s.data)) && !strings.HasPrefix(syn.Error(), "unexpected end") {
		off--
	}
	msg := fmt.Errorf("%s: %w", notArray, err)
	if strings.Contains(syn.Error(), "after top-level value") {
		msg = errors.New("data after the JSON array")
	}
	e := &KeysError{Entry: -1, Err: msg}
	e.Line, e.Column = lineCol(s.data, off)
	// Name the entry the error is in, if the array got that far.
	dec := json.NewDecoder(bytes.NewReader(s.data))
	if tok, _ := dec.Token(); tok == json.Delim('[') {
		for i := 0; dec.More() && skipSpace(s.data, dec.InputOffset()) <= off; i++ {
			if dec.Decode(new(json.RawMessage)) != nil {
				e.Entry = i // the error is inside entry i
				e.Err = fmt.Errorf("invalid JSON: %w", err)
				break
			}
		}
	}
	return e
}

// decodeError is the *KeysError for err, met decoding entry i (whose id,
// if it was read, is id). The JSON is well formed, so err is a type
// mismatch or an unknown field.
func (s *keysSource) decodeError(i int, id string, err error) *KeysError {
	var typ *json.UnmarshalTypeError
	if errors.As(err, &typ) {
		if typ.Field == "" {
			return s.fail(i, id, "", fmt.Errorf(`the entry is a JSON %s; want an object {"key","id","tenant","rpm","tpm"}`, typ.Value))
		}
		want := "a whole number (0 = unlimited)"
		if typ.Type.Kind() == reflect.String {
			want = "a string"
		}
		return s.fail(i, id, typ.Field, fmt.Errorf("%q: got a JSON %s, want %s", typ.Field, typ.Value, want))
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if field, uerr := strconv.Unquote(name); uerr == nil {
			e := s.fail(i, id, "", fmt.Errorf(`unknown field %q; the fields are "key", "id", "tenant", "rpm" and "tpm"`, field))
			if at, ok := fieldOffsetExact(s.data, s.starts[i], field); ok {
				e.Line, e.Column = lineCol(s.data, at)
			}
			e.Field = field
			return e
		}
	}
	return s.fail(i, id, "", err)
}

// fieldOffset returns the offset of the name of field in the object that
// starts at off, matched as encoding/json matches names (case folded;
// the last one wins), and reports whether there is one.
func fieldOffset(data []byte, off int64, field string) (int64, bool) {
	return findField(data, off, func(name string, _ int64) bool { return strings.EqualFold(name, field) })
}

// fieldOffsetExact is fieldOffset with names compared exactly.
func fieldOffsetExact(data []byte, off int64, field string) (int64, bool) {
	return findField(data, off, func(name string, _ int64) bool { return name == field })
}

// fieldAt returns the name of the field, in the object that starts at off,
// whose name or value holds the byte at offset b ("" if none does).
func fieldAt(data []byte, off, b int64) (field string) {
	findField(data, off, func(name string, at int64) bool {
		if at <= b {
			field = name
		}
		return at <= b
	})
	return field
}

// findField returns the offset of the last field of the object at off
// whose name (and the name's offset) match accepts.
func findField(data []byte, off int64, match func(name string, at int64) bool) (at int64, found bool) {
	if off < 0 || off >= int64(len(data)) {
		return 0, false
	}
	dec := json.NewDecoder(bytes.NewReader(data[off:]))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return 0, false
	}
	for dec.More() {
		start := off + skipSpace(data[off:], dec.InputOffset())
		tok, err := dec.Token()
		if err != nil {
			return at, found
		}
		if name, ok := tok.(string); ok && match(name, start) {
			at, found = start, true
		}
		if dec.Decode(new(json.RawMessage)) != nil {
			return at, found
		}
	}
	return at, found
}

// skipSpace returns the offset of the first byte at or after off that is
// neither JSON whitespace nor a comma or colon between values.
func skipSpace(data []byte, off int64) int64 {
	for off < int64(len(data)) {
		switch data[off] {
		case ' ', '\t', '\n', '\r', ',', ':':
			off++
		default:
			return off
		}
	}
	return off
}

// lineCol returns the line and column (both from 1, the column in bytes)
// of byte offset off in data.
func lineCol(data []byte, off int64) (line, col int) {
	off = min(max(off, 0), int64(len(data)))
	before := data[:off]
	line = bytes.Count(before, []byte("\n")) + 1
	col = int(off) - (bytes.LastIndexByte(before, '\n') + 1) + 1
	return line, col
}

// LoadKeys reads the keys file at path; see ParseKeys. Errors name the
// path.
func LoadKeys(path string) (*Keyring, error) {
	kr, _, err := loadKeys(path)
	return kr, err
}

// loadKeys is LoadKeys, also returning the file's bytes as read (nil if
// it could not be read).
func loadKeys(path string) (*Keyring, []byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("gateway: keys file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxKeysFileBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("gateway: keys file %s: %w", path, err)
	}
	kr, err := parseKeys(data)
	if err != nil {
		return nil, data, fmt.Errorf("%s: %w", path, err)
	}
	return kr, data, nil
}

// Lookup returns the key whose secret is secret and reports whether there
// is one.
func (kr *Keyring) Lookup(secret string) (Key, bool) {
	e, ok := kr.bySecret[sha256.Sum256([]byte(secret))]
	return e.key, ok
}

// Principal returns the caller the limit stage sees for the key whose
// secret is secret: its own limits and budgets, its tenant's, and its
// models' (the key's and the file's caps), and reports whether there is
// such a key. The Principal is shared: do not modify it.
func (kr *Keyring) Principal(secret string) (spenderhttp.Principal, bool) {
	e, ok := kr.bySecret[sha256.Sum256([]byte(secret))]
	return e.p, ok
}

// Budgets returns every budget the keys define, by the id a gateway's
// limiter leases it under (the key's id, and the ids principalOf gives its
// tenant's, models' and per-day budgets), with its limits; an unlimited
// budget is left out. An allocator holding these (cmd/allocator
// -limits-file) answers every gateway's lease calls by them.
func (kr *Keyring) Budgets() map[string]ration.Limits {
	out := make(map[string]ration.Limits)
	for _, e := range kr.bySecret {
		p := e.p
		if !p.Limits.Unlimited() {
			out[p.KeyID] = p.Limits
		}
		for _, b := range p.Budgets {
			out[b.Key] = b.Limits
		}
		for _, bs := range p.Models {
			for _, b := range bs {
				out[b.Key] = b.Limits
			}
		}
	}
	return out
}

// Len returns the number of keys.
func (kr *Keyring) Len() int { return len(kr.ids) }

// IDs returns the key IDs in the order they were given.
func (kr *Keyring) IDs() []string { return append([]string(nil), kr.ids...) }

// Current returns kr: a Keyring is a KeySource that never changes.
func (kr *Keyring) Current() *Keyring { return kr }
