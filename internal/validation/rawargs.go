package validation

import (
	"fmt"
	"path"
	"strings"
)

// modprobe.rawArgs are the Module author's argv for modprobe, but modprobe runs with
// CAP_SYS_MODULE on the node, so they get the rules of a moduleName load: modules come from the
// image's module directory (the worker passes -d itself), and no option may make modprobe read
// another configuration (whose install and remove commands run as root), another module tree, or a
// file of the node. Admission (Module), the operator and the worker (ModuleConfig) check them with
// RawArgs; the worker then rewrites them (worker.LoadArgs).
//
// modprobe (kmod) parses its argv with getopt_long: options may come anywhere (a module name
// does not end them, only "--" does), short options cluster ("-vd /opt"), an option's value may
// be attached ("-d/opt", "--dirname=/opt") and a long option may be abbreviated to any unique
// prefix ("--conf"). ParseModprobeArgs follows the same rules, so that what is checked is what
// modprobe would see.

// ModprobeOption is one option of kmod's modprobe.
type ModprobeOption struct {
	Long  string
	Short byte // 0 when it has none
	Arg   bool // takes a value
	// Refused says why the option is refused; "" when it is allowed (-d, -S and -w are checked
	// on their value).
	Refused string
}

const (
	whyConfig  = "makes modprobe read a configuration file instead of the worker's: its install and remove commands would run as root on the node"
	whyFile    = "makes modprobe read a module file named on the command line, which may be any file of the node"
	whyNotUsed = "prints information only and is not a load or unload"
)

// modprobeOptions are kmod's modprobe options (kmod 30 and later).
var modprobeOptions = []ModprobeOption{
	{Long: "all", Short: 'a'},
	{Long: "remove", Short: 'r'},
	{Long: "remove-dependencies"},
	{Long: "remove-holders"},
	{Long: "wait", Short: 'w', Arg: true},
	{Long: "resolve-alias", Short: 'R'},
	{Long: "first-time"},
	{Long: "ignore-install", Short: 'i'},
	{Long: "ignore-remove"},
	{Long: "use-blacklist", Short: 'b'},
	{Long: "force", Short: 'f'},
	{Long: "force-modversion"},
	{Long: "force-vermagic"},
	{Long: "show-depends", Short: 'D'},
	{Long: "showconfig", Short: 'c', Refused: whyNotUsed},
	{Long: "show-config", Refused: whyNotUsed},
	{Long: "show-modversions", Refused: whyFile},
	{Long: "dump-modversions", Refused: whyFile},
	{Long: "show-exports", Refused: whyFile},
	{Long: "dry-run", Short: 'n'},
	{Long: "show"},
	{Long: "config", Short: 'C', Arg: true, Refused: whyConfig},
	{Long: "dirname", Short: 'd', Arg: true},
	{Long: "set-version", Short: 'S', Arg: true},
	{Long: "syslog", Short: 's'},
	{Long: "quiet", Short: 'q'},
	{Long: "verbose", Short: 'v'},
	{Long: "version", Short: 'V', Refused: whyNotUsed},
	{Long: "help", Short: 'h', Refused: whyNotUsed},
}

// RawArgsError is a rawArgs argv the worker refuses; it is an InvalidConfig failure.
type RawArgsError struct {
	Arg string
	Why string
}

func (e *RawArgsError) Error() string {
	return fmt.Sprintf("modprobe.rawArgs: %q %s", e.Arg, e.Why)
}

// ParsedOption is an option of a parsed argv with its value.
type ParsedOption struct {
	Opt   *ModprobeOption
	Value string
}

// ParsedModprobeArgs is a rawArgs argv, parsed.
type ParsedModprobeArgs struct {
	Options []ParsedOption
	// Operands are the module names and parameters, in order.
	Operands []string
}

func lookupLong(name string) (*ModprobeOption, error) {
	var match *ModprobeOption
	for i := range modprobeOptions {
		o := &modprobeOptions[i]
		if o.Long == name {
			return o, nil
		}
		if strings.HasPrefix(o.Long, name) {
			if match != nil {
				return nil, fmt.Errorf("is an ambiguous abbreviation (--%s or --%s)", match.Long, o.Long)
			}
			match = o
		}
	}
	if match == nil {
		return nil, fmt.Errorf("is not a modprobe option the worker knows")
	}
	return match, nil
}

func lookupShort(c byte) *ModprobeOption {
	for i := range modprobeOptions {
		if modprobeOptions[i].Short == c {
			return &modprobeOptions[i]
		}
	}
	return nil
}

// ParseModprobeArgs splits argv as modprobe's getopt_long does.
func ParseModprobeArgs(argv []string) (ParsedModprobeArgs, error) {
	var out ParsedModprobeArgs
	for i := 0; i < len(argv); i++ {
		a := argv[i]
		var opts []ParsedOption
		var err error
		switch {
		case a == "--":
			out.Operands = append(out.Operands, argv[i+1:]...)
			return out, nil
		case strings.HasPrefix(a, "--"):
			opts, i, err = parseLong(argv, i)
		case strings.HasPrefix(a, "-") && len(a) > 1:
			opts, i, err = parseShort(argv, i)
		default:
			out.Operands = append(out.Operands, a)
		}
		if err != nil {
			return out, err
		}
		out.Options = append(out.Options, opts...)
	}
	return out, nil
}

// parseLong parses the long option argv[i] ("--name", "--name=value" or "--name value") and
// returns it with the index of the last argument it used.
func parseLong(argv []string, i int) ([]ParsedOption, int, error) {
	a := argv[i]
	name, value, hasValue := strings.Cut(a[2:], "=")
	o, err := lookupLong(name)
	if err != nil {
		return nil, i, &RawArgsError{Arg: a, Why: err.Error()}
	}
	switch {
	case o.Arg && !hasValue:
		if i+1 >= len(argv) {
			return nil, i, &RawArgsError{Arg: a, Why: "needs a value"}
		}
		i++
		value = argv[i]
	case !o.Arg && hasValue:
		return nil, i, &RawArgsError{Arg: a, Why: "takes no value"}
	}
	return []ParsedOption{{Opt: o, Value: value}}, i, nil
}

// parseShort parses the cluster of short options argv[i] ("-vq", "-vd/opt", "-vd /opt") and
// returns them with the index of the last argument it used.
func parseShort(argv []string, i int) ([]ParsedOption, int, error) {
	a := argv[i]
	var out []ParsedOption
	for j := 1; j < len(a); j++ {
		o := lookupShort(a[j])
		if o == nil {
			return nil, i, &RawArgsError{Arg: a, Why: fmt.Sprintf("has -%c, which is not a modprobe option the worker knows", a[j])}
		}
		if !o.Arg {
			out = append(out, ParsedOption{Opt: o})
			continue
		}
		value := a[j+1:]
		if value == "" {
			if i+1 >= len(argv) {
				return nil, i, &RawArgsError{Arg: a, Why: "needs a value"}
			}
			i++
			value = argv[i]
		}
		return append(out, ParsedOption{Opt: o, Value: value}), i, nil
	}
	return out, i, nil
}

// RawArgs parses a rawArgs argv and checks it for a Module whose modprobe.dirName is dirName
// ("" is /opt) and, when kernel is not "", for that kernel: options that are refused, a -d other
// than dirName, a -S other than kernel, no module named, a module file given by a relative path or
// by a path outside <dirName>/lib/modules[/<kernel>].
func RawArgs(argv []string, dirName, kernel string) (ParsedModprobeArgs, error) {
	p, err := ParseModprobeArgs(argv)
	if err != nil {
		return p, err
	}
	if dirName == "" {
		dirName = "/opt"
	}
	dirName = path.Clean("/" + dirName)
	for _, o := range p.Options {
		if err := checkOption(o, dirName, kernel); err != nil {
			return p, err
		}
	}
	if len(p.Operands) == 0 {
		return p, &RawArgsError{Arg: strings.Join(argv, " "), Why: "names no module"}
	}
	modules := path.Join(dirName, "lib/modules")
	if kernel != "" {
		modules = path.Join(modules, kernel)
	}
	for _, a := range p.Operands {
		if err := checkOperand(a, modules); err != nil {
			return p, err
		}
	}
	return p, nil
}

// checkOption refuses an option that is refused, or whose value is not the one the worker uses.
func checkOption(o ParsedOption, dirName, kernel string) error {
	flag := "--" + o.Opt.Long
	if o.Opt.Refused != "" {
		return &RawArgsError{Arg: flag, Why: o.Opt.Refused}
	}
	switch o.Opt.Long {
	case "dirname":
		if !strings.HasPrefix(o.Value, "/") || path.Clean(o.Value) != dirName {
			return &RawArgsError{Arg: flag + " " + o.Value, Why: fmt.Sprintf("names a module tree other than the image's modprobe.dirName %s (leave -d out: the worker passes it)", dirName)}
		}
	case "set-version":
		if kernel != "" && o.Value != kernel {
			return &RawArgsError{Arg: flag + " " + o.Value, Why: fmt.Sprintf("names a kernel other than the one the worker loads for (%s)", kernel)}
		}
	case "wait":
		if o.Value == "" || strings.Trim(o.Value, "0123456789") != "" {
			return &RawArgsError{Arg: flag + " " + o.Value, Why: "needs a number of milliseconds"}
		}
	}
	return nil
}

// checkOperand refuses a module file outside the directory modules (an image path).
func checkOperand(a, modules string) error {
	switch {
	case !strings.Contains(a, "/"):
		return nil // a module name or a parameter
	case !strings.HasPrefix(a, "/") && strings.Contains(a, "="):
		return nil // a parameter whose value has a slash
	case !strings.HasPrefix(a, "/"):
		return &RawArgsError{Arg: a, Why: "is a relative path: name a module, or a module file by its absolute path in the image"}
	case !strings.HasPrefix(path.Clean(a), modules+"/"):
		return &RawArgsError{Arg: a, Why: fmt.Sprintf("is outside the image's module directory %s", modules)}
	}
	return nil
}

// rawArgsMessage is the message of a RawArgs error without the "modprobe.rawArgs: " its Error
// starts with (the field path says it).
func rawArgsMessage(err error) string {
	return strings.TrimPrefix(err.Error(), "modprobe.rawArgs: ")
}
