package sidecar

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/rationhq/ration"
	"go.yaml.in/yaml/v3"
)

// ErrConfig is matched (errors.Is) by every error of LoadConfig and
// ParseConfig: the files are not a configuration ration can enforce. The
// message names the file and what is wrong.
var ErrConfig = errors.New("sidecar: invalid rate limit configuration")

// Bounds on a configuration directory: it is read whole at every reload.
const (
	maxConfigFiles = 1024
	maxConfigBytes = 16 << 20 // all files together
	maxConfigDepth = 32       // nested descriptor levels
)

// Config is a set of envoyproxy/ratelimit configuration files: per domain,
// a tree of descriptors whose leaves carry a rate limit. It is immutable
// and safe for concurrent use.
type Config struct {
	domains map[string]*node
	sum     [32]byte // SHA-256 of the files' names and contents
}

// node is one descriptor of the tree: what matches below it, and its rule.
type node struct {
	exact    map[entryKey]*node // key and value, or key alone (value "")
	wild     []wildNode         // values with '*', in file order
	rule     *rule              // nil: no rate_limit block
	share    bool               // share_threshold: values matched by this wildcard share one budget
	pattern  string             // the wildcard value, for share
	children bool               // has nested descriptors
}

type entryKey struct{ key, value string }

type wildNode struct {
	key   string
	parts []string // the value split on '*'
	n     *node
}

// rule is one rate_limit block.
type rule struct {
	Unit            rlsv3.RateLimitResponse_RateLimit_Unit
	RequestsPerUnit uint32
	Unlimited       bool     // unlimited: true: answered OK, nothing charged
	Shadow          bool     // shadow_mode: true: charged when it fits, never refuses
	Name            string   // rate_limit.name, for replaces
	Replaces        []string // the names this rule replaces in the same request
}

// Limits are the rule's ration budget: requests_per_unit hits per unit,
// a token bucket of that capacity refilled over the unit. Only the request
// dimension is used: a hit is a request, or whatever hits_addend counts.
func (r *rule) Limits() ration.Limits {
	return ration.Limits{RPM: int64(r.RequestsPerUnit), Window: unitWindow[r.Unit]}
}

// deny reports whether the rule refuses every hit: requests_per_unit 0,
// which envoyproxy/ratelimit uses to block a value outright. (ration's
// rate 0 means unlimited, so it is handled here, not by a bucket.)
func (r *rule) deny() bool { return !r.Unlimited && r.RequestsPerUnit == 0 }

// unitWindow maps the units ration's Limits.Window can hold (a week at
// most); month and year cannot be expressed and are refused at load.
var unitWindow = map[rlsv3.RateLimitResponse_RateLimit_Unit]time.Duration{
	rlsv3.RateLimitResponse_RateLimit_SECOND: time.Second,
	rlsv3.RateLimitResponse_RateLimit_MINUTE: time.Minute,
	rlsv3.RateLimitResponse_RateLimit_HOUR:   time.Hour,
	rlsv3.RateLimitResponse_RateLimit_DAY:    24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_WEEK:   7 * 24 * time.Hour,
}

// The YAML format of envoyproxy/ratelimit's configuration files (its
// README, "The configuration format"). Unknown keys are refused, as
// ratelimit refuses them.
type yamlRoot struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors"`
}

type yamlDescriptor struct {
	Key         string           `yaml:"key"`
	Value       string           `yaml:"value"`
	RateLimit   *yamlRateLimit   `yaml:"rate_limit"`
	Descriptors []yamlDescriptor `yaml:"descriptors"`
	ShadowMode  bool             `yaml:"shadow_mode"`
	// share_threshold: every value a wildcard matches shares one budget.
	ShareThreshold bool `yaml:"share_threshold"`
	// quota_mode changes what OVER_LIMIT means; ration refuses it rather
	// than enforce something else.
	QuotaMode bool `yaml:"quota_mode"`
	// Accepted and without effect: they only shape ratelimit's statistics
	// names and dynamic metadata.
	DetailedMetric bool           `yaml:"detailed_metric"`
	ValueToMetric  bool           `yaml:"value_to_metric"`
	Metadata       map[string]any `yaml:"metadata"`
}

type yamlRateLimit struct {
	RequestsPerUnit uint32 `yaml:"requests_per_unit"`
	Unit            string `yaml:"unit"`
	Unlimited       bool   `yaml:"unlimited"`
	Name            string `yaml:"name"`
	Replaces        []struct {
		Name string `yaml:"name"`
	} `yaml:"replaces"`
}

// LoadConfig reads every *.yaml and *.yml file directly in dir (not in
// subdirectories; names starting with '.' are skipped), as
// envoyproxy/ratelimit reads its runtime directory. Two files may not
// configure the same domain.
func LoadConfig(dir string) (*Config, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	files := map[string][]byte{}
	total := 0
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			continue
		}
		if len(files) == maxConfigFiles {
			return nil, fmt.Errorf("%w: %s: more than %d files", ErrConfig, dir, maxConfigFiles)
		}
		b, err := readCapped(filepath.Join(dir, name), maxConfigBytes-total)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		total += len(b)
		files[name] = b
	}
	return ParseConfig(files)
}

func readCapped(path string, room int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(room)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > room {
		return nil, fmt.Errorf("%s: the configuration files are over %d MiB together", path, maxConfigBytes>>20)
	}
	return b, nil
}

// ParseConfig parses configuration files given as name → content. It
// checks what envoyproxy/ratelimit checks (a domain per file, no domain in
// two files, a key on every descriptor, no duplicate descriptor, a valid
// unit, no unit with unlimited, replaces entries with a name other than
// the rule's own) and what ration cannot enforce: month and year units
// (ration's longest window is a week) and quota_mode.
func ParseConfig(files map[string][]byte) (*Config, error) {
	c := &Config{domains: map[string]*node{}}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	sum := sha256.New()
	for _, name := range names {
		fmt.Fprintf(sum, "%d:%s%d:", len(name), name, len(files[name]))
		sum.Write(files[name])
		var root yamlRoot
		dec := yaml.NewDecoder(bytes.NewReader(files[name]))
		dec.KnownFields(true)
		if err := dec.Decode(&root); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: %s: %w", ErrConfig, name, err)
		}
		if root.Domain == "" {
			return nil, fmt.Errorf("%w: %s: the domain is empty", ErrConfig, name)
		}
		if _, dup := c.domains[root.Domain]; dup {
			return nil, fmt.Errorf("%w: %s: domain %q is configured by another file too", ErrConfig, name, root.Domain)
		}
		n := &node{}
		if err := n.load(root.Descriptors, root.Domain, 1); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrConfig, name, err)
		}
		c.domains[root.Domain] = n
	}
	sum.Sum(c.sum[:0])
	return c, nil
}

// Sum returns a digest of the files the configuration was parsed from:
// equal sums, equal files.
func (c *Config) Sum() [32]byte { return c.sum }

// load adds descs below n; path names n for errors.
func (n *node) load(descs []yamlDescriptor, path string, depth int) error {
	if depth > maxConfigDepth {
		return fmt.Errorf("%s: descriptors nested deeper than %d levels", path, maxConfigDepth)
	}
	for _, d := range descs {
		if d.Key == "" {
			return fmt.Errorf("%s: a descriptor has an empty key", path)
		}
		here := path + "." + d.Key
		if d.Value != "" {
			here += "_" + d.Value
		}
		k := entryKey{d.Key, d.Value}
		if _, dup := n.exact[k]; dup {
			return fmt.Errorf("duplicate descriptor %q", here)
		}
		if d.QuotaMode {
			return fmt.Errorf("%s: quota_mode is not supported by ration", here)
		}
		wild := strings.Contains(d.Value, "*")
		if d.ShareThreshold && !wild {
			return fmt.Errorf("%s: share_threshold needs a wildcard value (containing '*')", here)
		}
		child := &node{share: d.ShareThreshold, pattern: d.Value, children: len(d.Descriptors) > 0}
		if d.RateLimit != nil {
			r, err := ruleOf(d.RateLimit, d.ShadowMode)
			if err != nil {
				return fmt.Errorf("%s: %w", here, err)
			}
			child.rule = r
		}
		if err := child.load(d.Descriptors, here, depth+1); err != nil {
			return err
		}
		if n.exact == nil {
			n.exact = map[entryKey]*node{}
		}
		n.exact[k] = child
		if wild {
			n.wild = append(n.wild, wildNode{key: d.Key, parts: strings.Split(d.Value, "*"), n: child})
		}
	}
	return nil
}

func ruleOf(y *yamlRateLimit, shadow bool) (*rule, error) {
	r := &rule{RequestsPerUnit: y.RequestsPerUnit, Unlimited: y.Unlimited, Shadow: shadow, Name: y.Name}
	unit, known := rlsv3.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(y.Unit)]
	valid := known && unit != int32(rlsv3.RateLimitResponse_RateLimit_UNKNOWN)
	switch {
	case y.Unlimited && valid:
		return nil, errors.New("a rate limit with unlimited: true has no unit")
	case y.Unlimited:
	case !valid:
		return nil, fmt.Errorf("invalid rate limit unit %q: want second, minute, hour, day or week", y.Unit)
	default:
		r.Unit = rlsv3.RateLimitResponse_RateLimit_Unit(unit)
		if _, ok := unitWindow[r.Unit]; !ok {
			return nil, fmt.Errorf("unit %s is not supported: ration's longest window is a week", strings.ToLower(y.Unit))
		}
	}
	for _, rp := range y.Replaces {
		switch rp.Name {
		case "":
			return nil, errors.New("a replaces entry has no name")
		case y.Name:
			return nil, fmt.Errorf("replaces names the rule's own name %q", y.Name)
		}
		r.Replaces = append(r.Replaces, rp.Name)
	}
	return r, nil
}

// Domains returns the number of domains configured.
func (c *Config) Domains() int { return len(c.domains) }

// match is the rule for one request descriptor (its entries, without
// ration's pairing entries) in domain, as envoyproxy/ratelimit finds it:
// level by level, the key and value first, then a wildcard value, then the
// key alone; the rule counts only if its level is the descriptor's last
// entry. shared[i] is the wildcard pattern that stands for entry i's value
// in the budget key (share_threshold), or "". nil: no rule applies.
func (c *Config) match(domain string, entries []entry) (r *rule, shared []string) {
	n := c.domains[domain]
	if n == nil {
		return nil, nil
	}
	for i, e := range entries {
		next, viaWild := n.exact[entryKey{e.key, e.value}], false
		if next == nil {
			for _, w := range n.wild {
				if w.key == e.key && wildMatch(w.parts, e.value) {
					next, viaWild = w.n, true
					break
				}
			}
		}
		if next == nil {
			next = n.exact[entryKey{e.key, ""}]
		}
		if next == nil {
			return nil, nil
		}
		if viaWild && next.share {
			if shared == nil {
				shared = make([]string, len(entries))
			}
			shared[i] = next.pattern
		}
		if i == len(entries)-1 {
			return next.rule, shared
		}
		if !next.children {
			return nil, nil // more entries than levels
		}
		n = next
	}
	return nil, nil
}

// wildMatch reports whether value matches the pattern split on '*' into
// parts: each '*' stands for any run of characters, possibly empty.
func wildMatch(parts []string, value string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}
