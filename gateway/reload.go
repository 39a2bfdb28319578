package gateway

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rationhq/ration"
)

// KeysReloader keeps a LiveKeys in step with a keys file. Reload (and
// SIGHUP, through Run) reads the file, validates all of it with the one
// parser (ParseKeys), and only then puts the new Keyring in force with one
// atomic swap; a file that fails validation is refused whole, logged at
// ERROR with its line, column, entry and field, counted, and the keys in
// force stay. Run also polls the file's content.
//
// What a swap means for requests: one in flight keeps the Keyring (and so
// its key's limits) it was authenticated with; the next request of a
// removed key is 401; an added key works from its next request; a key
// whose limits changed is admitted under the new limits from its next
// request: the Limiter follows changed limits per call, a leased key
// keeps its lease and the allocator follows the latest limits it is sent,
// so no budget is lost or minted (docs/gateway-demo.md).
//
// Metrics (Register), prefixed ration_gateway_keys_:
//
//	reloads_total{result}                      reloads by result: ok, error
//	loaded                                     keys in force
//	last_reload_success_timestamp_seconds      when the keys in force were loaded
//	last_reload_successful                     1 unless the last reload was refused
//
// A KeysReloader is safe for concurrent use; reloads are serialised.
type KeysReloader struct {
	path  string
	keys  *LiveKeys
	log   *slog.Logger
	clock ration.Clock
	m     *reloadMetrics

	mu      sync.Mutex        // serialises reloads and polls; guards the fields below
	seen    [sha256.Size]byte // what was last read and acted on (put in force, or refused)
	pending [sha256.Size]byte // a poll found this content bad once; reported if the next poll finds it again
	hasPend bool
	timer   ration.Timer // the next poll; nil when none is scheduled
	stopped bool         // Run returned: schedule no more polls
	polls   sync.WaitGroup
}

// NewKeysReloader loads the keys file at path (as LoadKeys does: a bad
// file is an error here) and returns a reloader whose Keys serve it.
// logger nil discards; clock nil is the system clock (it schedules polls
// and stamps successful loads).
func NewKeysReloader(path string, logger *slog.Logger, clock ration.Clock) (*KeysReloader, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if clock == nil {
		clock = ration.SystemClock{}
	}
	kr, data, err := loadKeys(path)
	if err != nil {
		return nil, err
	}
	r := &KeysReloader{path: path, keys: NewLiveKeys(kr), log: logger, clock: clock, m: newReloadMetrics(), seen: sha256.Sum256(data)}
	r.m.loaded.Set(float64(kr.Len()))
	r.m.lastSuccess.Set(unixSeconds(clock.Now()))
	r.m.lastOK.Set(1)
	return r, nil
}

// Keys returns the LiveKeys the reloader keeps; pass it to New.
func (r *KeysReloader) Keys() *LiveKeys { return r.keys }

// Path returns the keys file's path.
func (r *KeysReloader) Path() string { return r.path }

// Register registers the reload metrics on reg. The same reloader may be
// registered on several registries (one per gateway instance that serves
// its keys), and each then shows them.
func (r *KeysReloader) Register(reg prometheus.Registerer) error {
	for _, c := range r.m.collectors() {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("gateway: registering keys reload metrics: %w", err)
		}
	}
	return nil
}

// Reload reads and validates the keys file now and, if it is good, puts
// it in force, whether or not it changed. It returns what changed, or the
// reason the file was refused (a *KeysError for a file that does not
// validate), in which case the keys in force stay.
func (r *KeysReloader) Reload() (KeysDiff, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reloadLocked("request")
}

// Run polls the file every interval (none if interval <= 0) and reloads
// on every value received from hup (SIGHUP: signal.Notify(hup,
// syscall.SIGHUP)); nil hup receives nothing. It returns when ctx is done,
// once no poll is running.
//
// A poll reads the whole file and compares its SHA-256 with the content
// last acted on; it reloads only when they differ. Polling the content,
// rather than watching for events (fsnotify) or comparing modification
// times, was chosen because it sees every way a file gets replaced the
// same way: an editor that writes a new file and renames it over the old
// one (an inotify watch on the file then follows the old inode, and a
// directory watch must filter names), a Kubernetes ConfigMap or Secret
// volume that swaps a symlink, network filesystems that deliver no
// events, two writes within one mtime tick, a copy that keeps the old
// mtime; it needs no dependency, no watch descriptors and no rewatch
// after a rename. It costs one read and hash of the file per interval
// (microseconds for a keys file of a few thousand entries) and up to one
// interval of delay; SIGHUP reloads at once.
//
// A poll that finds new content which does not validate waits one more
// interval before refusing it: a file caught half written (truncated, then
// written in place) is loaded on the next poll without an error being
// logged or counted. Content that is still bad on the next poll is
// refused as Reload refuses it. A SIGHUP never waits.
//
// Call Run once; after it returns, nothing polls.
func (r *KeysReloader) Run(ctx context.Context, interval time.Duration, hup <-chan os.Signal) {
	if interval > 0 {
		r.mu.Lock()
		r.schedulePollLocked(interval)
		r.mu.Unlock()
	}
	defer func() {
		r.mu.Lock()
		r.stopped = true
		if r.timer != nil && r.timer.Stop() {
			r.polls.Done() // the scheduled poll will not run
		}
		r.timer = nil
		r.mu.Unlock()
		r.polls.Wait()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.mu.Lock()
			_, _ = r.reloadLocked("signal")
			r.mu.Unlock()
		}
	}
}

// schedulePollLocked arranges a poll in interval.
func (r *KeysReloader) schedulePollLocked(interval time.Duration) {
	if r.stopped {
		return
	}
	r.polls.Add(1)
	r.timer = r.clock.AfterFunc(interval, func() {
		defer r.polls.Done()
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.stopped {
			return
		}
		r.pollLocked()
		r.schedulePollLocked(interval)
	})
}

// Poll checks the file once, as Run's polling does: it reloads if the
// content changed since it was last acted on, and reports whether it did.
func (r *KeysReloader) Poll() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pollLocked()
}

func (r *KeysReloader) pollLocked() bool {
	kr, sum, err := r.read()
	if sum == r.seen {
		r.hasPend = false
		return false
	}
	if err != nil && !(r.hasPend && r.pending == sum) {
		r.pending, r.hasPend = sum, true
		r.log.Debug("gateway: keys file changed and does not validate; looking again at the next poll before refusing it",
			"path", r.path, "err", err)
		return false
	}
	r.hasPend = false
	r.apply(kr, sum, err, "file changed")
	return true
}

// reloadLocked reads the file and applies it.
func (r *KeysReloader) reloadLocked(trigger string) (KeysDiff, error) {
	kr, sum, err := r.read()
	r.hasPend = false
	return r.apply(kr, sum, err, trigger)
}

// read reads and validates the file. sum identifies what was read: the
// content's hash, or the failure's when the file could not be read.
func (r *KeysReloader) read() (*Keyring, [sha256.Size]byte, error) {
	kr, data, err := loadKeys(r.path)
	if data == nil && err != nil {
		return nil, sha256.Sum256([]byte("unreadable: " + err.Error())), err
	}
	return kr, sha256.Sum256(data), err
}

// apply puts kr in force, or refuses the file for err; sum is what was
// read.
func (r *KeysReloader) apply(kr *Keyring, sum [sha256.Size]byte, err error, trigger string) (KeysDiff, error) {
	r.seen = sum
	if err != nil {
		r.m.reloads.WithLabelValues("error").Inc()
		r.m.lastOK.Set(0)
		attrs := []any{"path", r.path, "trigger", trigger, "keys_in_force", r.keys.Current().Len(), "err", err}
		var ke *KeysError
		if errors.As(err, &ke) {
			if ke.Line > 0 {
				attrs = append(attrs, "line", ke.Line, "column", ke.Column)
			}
			if ke.Entry >= 0 {
				attrs = append(attrs, "entry", ke.Entry)
			}
			if ke.ID != "" {
				attrs = append(attrs, "id", ke.ID)
			}
			if ke.Field != "" {
				attrs = append(attrs, "field", ke.Field)
			}
		}
		r.log.Error("gateway: keys file refused; the keys in force stay", attrs...)
		return KeysDiff{}, err
	}
	old := r.keys.Swap(kr)
	d := DiffKeys(old, kr)
	r.m.reloads.WithLabelValues("ok").Inc()
	r.m.loaded.Set(float64(kr.Len()))
	r.m.lastSuccess.Set(unixSeconds(r.clock.Now()))
	r.m.lastOK.Set(1)
	r.log.Info("gateway: keys reloaded", "path", r.path, "trigger", trigger, "keys", d.Keys,
		"added", len(d.Added), "removed", len(d.Removed), "changed", len(d.Changed),
		"added_ids", firstIDs(d.Added), "removed_ids", firstIDs(d.Removed), "changed_ids", firstIDs(d.Changed))
	return d, nil
}

// maxLoggedIDs bounds the ids a reload's log line lists per kind.
const maxLoggedIDs = 10

// firstIDs is ids for a log line: at most maxLoggedIDs, then "..." and how
// many more.
func firstIDs(ids []string) string {
	if len(ids) <= maxLoggedIDs {
		return fmt.Sprint(ids)
	}
	return fmt.Sprintf("%v... (%d more)", ids[:maxLoggedIDs], len(ids)-maxLoggedIDs)
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// reloadMetrics are a KeysReloader's metrics.
type reloadMetrics struct {
	reloads     *prometheus.CounterVec
	loaded      prometheus.Gauge
	lastSuccess prometheus.Gauge
	lastOK      prometheus.Gauge
}

func newReloadMetrics() *reloadMetrics {
	const ns, sub = "ration", "gateway"
	m := &reloadMetrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "keys_reloads_total",
			Help: "Reloads of the keys file, by result: ok (put in force), error (refused; the keys in force stayed)."}, []string{"result"}),
		loaded: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "keys_loaded",
			Help: "API keys in force."}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "keys_last_reload_success_timestamp_seconds",
			Help: "When the keys in force were loaded (at start or by the last successful reload), in Unix seconds."}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "keys_last_reload_successful",
			Help: "1 if the last load of the keys file succeeded, 0 if it was refused (the previous keys are in force)."}),
	}
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("error")
	return m
}

func (m *reloadMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.reloads, m.loaded, m.lastSuccess, m.lastOK}
}
