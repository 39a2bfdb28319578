// Package envflag lets environment variables set a command's flags: each
// flag -some-name may also come from PREFIX_SOME_NAME. Flags given on the
// command line override the environment.
package envflag

import (
	"flag"
	"fmt"
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
