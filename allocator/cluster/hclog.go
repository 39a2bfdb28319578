package cluster

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
)

// slogLevel maps hclog's levels to slog's; Trace is below Debug.
func slogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

// slogAdapter is an hclog.Logger that writes to a *slog.Logger, so that
// raft logs where the rest of the process does. hclog's key/value
// arguments become slog attributes, readable (see attrs); raft's lines
// about calls to an unreachable peer go through peers. The level is the
// slog handler's: SetLevel does nothing.
type slogAdapter struct {
	l       *slog.Logger
	name    string
	implied []any
	peers   *peerLog // shared by the loggers With and Named derive
}

func newHclog(l *slog.Logger) *slogAdapter {
	return &slogAdapter{l: l, peers: newPeerLog(l, time.Now)}
}

func (a *slogAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off {
		return
	}
	if peer, ok, unreachable := peerFailure(msg, args); ok && a.peers.failed(msg, peer, unreachable, attrs(a.name, args, "peer", "target", "server-id")) {
		return
	}
	lv := slogLevel(level)
	if !a.l.Enabled(context.Background(), lv) {
		return
	}
	a.l.LogAttrs(context.Background(), lv, msg, attrs(a.name, args)...)
}

// attrs turns hclog's key/value arguments into slog attributes, but for
// the keys in drop: keys in snake case ("backoff time" is backoff_time),
// values as an operator reads them (see readable), and the logger's name
// first when it has one. A value without a key is "extra".
func attrs(name string, args []any, drop ...string) []slog.Attr {
	out := make([]slog.Attr, 0, len(args)/2+1)
	if name != "" {
		out = append(out, slog.String("logger", name))
	}
	for i := 0; i < len(args); i += 2 {
		if i+1 == len(args) {
			out = append(out, slog.Attr{Key: "extra", Value: readable(args[i])})
			break
		}
		key := fmt.Sprint(args[i])
		if !slices.Contains(drop, key) {
			out = append(out, slog.Attr{Key: strings.NewReplacer(" ", "_", "-", "_").Replace(key), Value: readable(args[i+1])})
		}
	}
	return out
}

// readable is v as a log line should show it: hclog's format-style values
// (hclog.Fmt, as raft logs its configurations) formatted, a duration as
// "500ms" rather than nanoseconds, and a value with a String method (raft
// logs itself: "Node at 127.0.0.1:7451 [Follower]") as that string, where
// a JSON handler would print {}.
func readable(v any) slog.Value {
	switch x := v.(type) {
	case hclog.Format:
		if f, ok := firstString(x); ok {
			return slog.StringValue(fmt.Sprintf(f, x[1:]...))
		}
		return slog.StringValue(fmt.Sprint(x...))
	case hclog.Hex:
		return slog.StringValue(fmt.Sprintf("0x%x", int(x)))
	case hclog.Octal:
		return slog.StringValue(fmt.Sprintf("0%o", int(x)))
	case hclog.Binary:
		return slog.StringValue(fmt.Sprintf("0b%b", int(x)))
	case hclog.Quote:
		return slog.StringValue(strconv.Quote(string(x)))
	case error:
		return slog.StringValue(x.Error())
	case fmt.Stringer:
		return slog.StringValue(x.String())
	}
	return slog.AnyValue(v)
}

func firstString(f hclog.Format) (string, bool) {
	if len(f) == 0 {
		return "", false
	}
	s, ok := f[0].(string)
	return s, ok
}

func (a *slogAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }
func (a *slogAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }
func (a *slogAdapter) Info(msg string, args ...any)  { a.Log(hclog.Info, msg, args...) }
func (a *slogAdapter) Warn(msg string, args ...any)  { a.Log(hclog.Warn, msg, args...) }
func (a *slogAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }

func (a *slogAdapter) enabled(l hclog.Level) bool {
	return a.l.Enabled(context.Background(), slogLevel(l))
}

func (a *slogAdapter) IsTrace() bool { return a.enabled(hclog.Trace) }
func (a *slogAdapter) IsDebug() bool { return a.enabled(hclog.Debug) }
func (a *slogAdapter) IsInfo() bool  { return a.enabled(hclog.Info) }
func (a *slogAdapter) IsWarn() bool  { return a.enabled(hclog.Warn) }
func (a *slogAdapter) IsError() bool { return a.enabled(hclog.Error) }

func (a *slogAdapter) ImpliedArgs() []any { return a.implied }

func (a *slogAdapter) With(args ...any) hclog.Logger {
	b := *a
	b.l = a.l.With(attrsAny(attrs("", args))...)
	b.implied = append(a.implied[:len(a.implied):len(a.implied)], args...)
	return &b
}

func attrsAny(attrs []slog.Attr) []any {
	out := make([]any, len(attrs))
	for i, at := range attrs {
		out[i] = at
	}
	return out
}

func (a *slogAdapter) Name() string { return a.name }

func (a *slogAdapter) Named(name string) hclog.Logger {
	if a.name != "" {
		name = a.name + "." + name
	}
	return a.ResetNamed(name)
}

func (a *slogAdapter) ResetNamed(name string) hclog.Logger {
	b := *a
	b.name = name
	return &b
}

func (a *slogAdapter) SetLevel(hclog.Level) {}

func (a *slogAdapter) GetLevel() hclog.Level {
	for _, l := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error} {
		if a.enabled(l) {
			return l
		}
	}
	return hclog.Off
}

func (a *slogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	level := slog.LevelInfo
	if opts != nil && opts.ForceLevel != hclog.NoLevel {
		level = slogLevel(opts.ForceLevel)
	}
	return slog.NewLogLogger(a.l.Handler(), level)
}

func (a *slogAdapter) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	return a.StandardLogger(opts).Writer()
}
