// Command builder is the entrypoint of kmm's builder image: a one-shot build in a pod. It starts
// BuildKit's daemon (buildkitd, OCI worker on runc) inside the pod, has buildctl
// build the Dockerfile of the mounted ConfigMap and push the image, stops the daemon, and writes
// the result — the pushed digest, or the tail of the build log — as the pod's termination message
// (build.Result). The flags are those build.Pod passes (package build). Run under the name
// kmm-runc (a link in the image) it is the runc buildkitd runs in an unprivileged pod instead.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kmm-project/kmm/build"
	"github.com/kmm-project/kmm/registry"
)

type options struct {
	dockerfileDir, image, dockerConfig, secretsDir, stateDir, terminationLog string
	buildkitd, buildctl                                                      string
	buildArgs                                                                listFlag
	timeout                                                                  time.Duration
	baseInsecure, baseSkipVerify, pushInsecure, pushSkipVerify               bool
	unprivileged                                                             bool
	// registry are the worker's registry settings (registry.Flags): the same flags the operator
	// gives every worker and sign pod.
	registry registry.Flags
}

type listFlag struct{ values *[]string }

func (l listFlag) String() string {
	if l.values == nil {
		return ""
	}
	return strings.Join(*l.values, ",")
}

func (l listFlag) Set(v string) error { *l.values = append(*l.values, v); return nil }

func parseFlags(args []string, errOut io.Writer) (options, []string, error) {
	var o options
	var buildArgs []string
	o.buildArgs = listFlag{&buildArgs}
	fs := flag.NewFlagSet("builder", flag.ContinueOnError)
	fs.SetOutput(errOut)
	name := func(f string) string { return strings.TrimPrefix(f, "--") }
	fs.StringVar(&o.dockerfileDir, name(build.FlagDockerfileDir), build.DockerfileDir, "Directory holding the Dockerfile (the build context).")
	fs.StringVar(&o.image, name(build.FlagImage), "", "Image reference to push. Required.")
	fs.Var(o.buildArgs, name(build.FlagBuildArg), "NAME=VALUE build argument; repeatable.")
	fs.StringVar(&o.dockerConfig, name(build.FlagDockerConfig), "", "Directory of a Docker config.json with the registries' credentials.")
	fs.StringVar(&o.secretsDir, name(build.FlagSecretsDir), "", "Directory of Secrets (<dir>/<secret>/<key>), given to the build as secrets <secret>/<key>.")
	fs.StringVar(&o.stateDir, name(build.FlagStateDir), build.StateDir, "buildkitd's state directory (an emptyDir).")
	fs.DurationVar(&o.timeout, name(build.FlagTimeout), build.Deadline-time.Minute, "Deadline of the whole build.")
	fs.BoolVar(&o.baseInsecure, name(build.FlagBaseInsecure), false, "Pull the FROM images' registries over plain HTTP.")
	fs.BoolVar(&o.baseSkipVerify, name(build.FlagBaseSkipVerify), false, "Accept any certificate of the FROM images' registries.")
	fs.BoolVar(&o.pushInsecure, name(build.FlagPushInsecure), false, "Push over plain HTTP.")
	fs.BoolVar(&o.pushSkipVerify, name(build.FlagPushSkipVerify), false, "Accept any certificate of the push registry.")
	fs.BoolVar(&o.unprivileged, name(build.FlagUnprivileged), false, "The pod is not privileged: RUN steps get no cgroups of their own and no /sys (runc --rootless=true).")
	o.registry.Bind(fs)
	fs.StringVar(&o.terminationLog, "termination-log", "/dev/termination-log", "File the JSON result is written to.")
	fs.StringVar(&o.buildkitd, "buildkitd", "/usr/local/bin/buildkitd", "buildkitd binary.")
	fs.StringVar(&o.buildctl, "buildctl", "/usr/local/bin/buildctl", "buildctl binary.")
	if err := fs.Parse(args); err != nil {
		return o, nil, err
	}
	switch {
	case fs.NArg() > 0:
		return o, nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.image == "":
		return o, nil, errors.New(build.FlagImage + " is required")
	case o.timeout <= 0:
		return o, nil, fmt.Errorf("%s must be positive, got %s", build.FlagTimeout, o.timeout)
	case o.registry.Check() != nil:
		return o, nil, o.registry.Check()
	}
	for _, a := range buildArgs {
		if k, _, ok := strings.Cut(a, "="); !ok || k == "" {
			return o, nil, fmt.Errorf("build argument %q is not NAME=VALUE", a)
		}
	}
	return o, buildArgs, nil
}

func main() {
	if filepath.Base(os.Args[0]) == runcWrapper {
		execRunc(os.Args[1:])
	}
	o, args, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	res := run(ctx, o, args, os.Stderr)
	cancel()
	code := 0
	if !res.Succeeded() {
		code = 1
		fmt.Fprintf(os.Stderr, "build failed: %s\n", res.Message)
	} else {
		fmt.Fprintf(os.Stderr, "pushed %s@%s\n", res.Image, res.Digest)
	}
	if err := writeResult(o.terminationLog, res); err != nil {
		fmt.Fprintf(os.Stderr, "writing the result: %v\n", err)
		code = 1
	}
	os.Exit(code)
}

// execRunc replaces the process with runc, adding --rootless=true (ignore the cgroups an
// unprivileged pod cannot create) and, to run and create, --no-new-keyring and --no-pivot: the
// runtime's default seccomp profile refuses the session keyring runc would make (keyctl) and
// pivot_root(2); runc then enters the step's root file system with MS_MOVE and chroot.
func execRunc(args []string) {
	runc, err := exec.LookPath("runc")
	if err == nil {
		err = syscall.Exec(runc, runcArgs(args), os.Environ()) //nolint:gosec // G204: runc, for buildkitd
	}
	fmt.Fprintf(os.Stderr, "%s: %v\n", runcWrapper, err)
	os.Exit(127)
}

// runcGlobalValueFlags are runc's global flags that take a separate value.
var runcGlobalValueFlags = map[string]bool{"--log": true, "--log-format": true, "--root": true, "--criu": true}

// runcArgs is runc's argv for buildkitd's args.
func runcArgs(args []string) []string {
	out := []string{"runc", "--rootless=true"}
	for i := 0; i < len(args); i++ {
		a := args[i]
		out = append(out, a)
		switch {
		case runcGlobalValueFlags[a] && i+1 < len(args):
			i++
			out = append(out, args[i])
		case strings.HasPrefix(a, "-"):
		default: // the subcommand: the rest is its own
			if a == "run" || a == "create" {
				out = append(out, "--no-new-keyring", "--no-pivot")
			}
			return append(out, args[i+1:]...)
		}
	}
	return out
}

func writeResult(file string, r build.Result) error {
	data, err := r.Marshal()
	if err != nil {
		return err
	}
	return os.WriteFile(file, data, 0o644) //nolint:gosec // G306: the termination log is read by the kubelet
}
