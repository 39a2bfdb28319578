// Package envflag lets environment variables set a command's flags: each
// flag -some-name may also come from PREFIX_SOME_NAME. Flags given on the
// command line override the environment.
package envflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// Name returns the environment variable for flag name under prefix:
// Name("RATION_", "lease-ttl") is "RATION_LEASE_TTL".
func Name(prefix, flagName string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Apply sets every flag of fs whose variable is set in getenv. Call it
// before fs.Parse, so that the command line wins. The error names the
// variable and its value.
func Apply(fs *flag.FlagSet, prefix string, getenv func(string) string) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		name := Name(prefix, f.Name)
		if v := getenv(name); v != "" && err == nil {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %w", name, v, e)
			}
		}
	})
	return err
}

// Parse applies the environment (Apply), then the command line, and
// refuses positional arguments: the whole of a command's configuration
// step for flags.
func Parse(fs *flag.FlagSet, prefix string, getenv func(string) string, args []string) error {
	if err := Apply(fs, prefix, getenv); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return nil
}

// ParseHelp is Parse for a command whose -help (or -h) writes head, then
// fs's flags with their variables (PrintDefaults), to help, and returns
// flag.ErrHelp. fs prints nothing itself: the caller reports any other
// error once.
func ParseHelp(fs *flag.FlagSet, prefix string, getenv func(string) string, args []string, help io.Writer, head string) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := Parse(fs, prefix, getenv, args)
	if errors.Is(err, flag.ErrHelp) {
		io.WriteString(help, head)
		PrintDefaults(help, fs, prefix)
	}
	return err
}

// PrintDefaults writes fs's flags to w in the manner of
// flag.FlagSet.PrintDefaults, each followed by the environment variable
// that also sets it, so that -help lists every variable a command reads
// from the flags it defines.
func PrintDefaults(w io.Writer, fs *flag.FlagSet, prefix string) {
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		var b strings.Builder
		b.WriteString("  -" + f.Name)
		if typ != "" {
			b.WriteString(" " + typ)
		}
		b.WriteString("    (env " + Name(prefix, f.Name) + ")\n    \t")
		b.WriteString(strings.ReplaceAll(usage, "\n", "\n    \t"))
		switch f.DefValue {
		case "", "0", "false", "0s", "[]":
		default:
			if g, ok := f.Value.(flag.Getter); ok && isString(g.Get()) {
				fmt.Fprintf(&b, " (default %q)", f.DefValue)
			} else {
				fmt.Fprintf(&b, " (default %v)", f.DefValue)
			}
		}
		fmt.Fprintln(w, b.String())
	})
}

func isString(v any) bool {
	_, ok := v.(string)
	return ok
}
