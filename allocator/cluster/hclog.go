package cluster

import (
	"context"
	"io"
	"log"
	"log/slog"

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
// raft logs where the rest of the process does. hclog's arguments are
// key/value pairs, as slog's are. The level is the slog handler's:
// SetLevel does nothing.
type slogAdapter struct {
	l       *slog.Logger
	name    string
	implied []any
}

func newHclog(l *slog.Logger) hclog.Logger { return &slogAdapter{l: l} }

func (a *slogAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off {
		return
	}
	lv := slogLevel(level)
	if !a.l.Enabled(context.Background(), lv) {
		return
	}
	if a.name != "" {
		args = append([]any{"logger", a.name}, args...)
	}
	a.l.Log(context.Background(), lv, msg, args...)
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
	return &slogAdapter{l: a.l.With(args...), name: a.name, implied: append(a.implied[:len(a.implied):len(a.implied)], args...)}
}

func (a *slogAdapter) Name() string { return a.name }

func (a *slogAdapter) Named(name string) hclog.Logger {
	if a.name != "" {
		name = a.name + "." + name
	}
	return &slogAdapter{l: a.l, name: name, implied: a.implied}
}

func (a *slogAdapter) ResetNamed(name string) hclog.Logger {
	return &slogAdapter{l: a.l, name: name, implied: a.implied}
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
