// Command kmm-deploy installs kmm into a cluster from a kustomization (config/default by default)
// without kubectl: it renders it with bin/kustomize, the images set with `kustomize edit set
// image`, and server-side applies the objects in install order; `delete` removes them, CRDs last,
// and refuses while Modules exist. `make deploy` and `make undeploy` run it.
//
//	kmm-deploy apply  [--kustomize bin/kustomize] [--image kmm-manager=<ref>] [--image kmm-worker=<ref>] [--dry-run] [dir]
//	kmm-deploy delete [--kustomize bin/kustomize] [--force] [dir]
//	kmm-deploy render [--kustomize bin/kustomize] [--image ...] [dir]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/yaml"

	"github.com/kmm-project/kmm/test/install"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kmm-deploy:", err)
		os.Exit(1)
	}
}

type images []string

func (i *images) String() string     { return strings.Join(*i, ",") }
func (i *images) Set(v string) error { *i = append(*i, v); return nil }

// flags are kmm-deploy's command line.
type flags struct {
	verb, kustomize, dir string
	images               images
	dryRun, force        bool
}

func parse(args []string) (flags, error) {
	var f flags
	if len(args) == 0 || (args[0] != "apply" && args[0] != "delete" && args[0] != "render") {
		return f, errors.New("usage: kmm-deploy apply|delete|render [flags] [kustomization dir]")
	}
	f.verb = args[0]
	fs := flag.NewFlagSet(f.verb, flag.ContinueOnError)
	fs.StringVar(&f.kustomize, "kustomize", "bin/kustomize", "The kustomize binary (make tools builds it).")
	fs.Var(&f.images, "image", "name=reference, as for `kustomize edit set image` (repeatable), e.g. kmm-manager=registry.example.com/kmm-manager:v1.")
	fs.BoolVar(&f.dryRun, "dry-run", false, "apply: have the API server check every object and store none.")
	fs.BoolVar(&f.force, "force", false, "delete: delete even while Modules exist (their kmods stay loaded and their finalizers block until removed by hand).")
	if err := fs.Parse(args[1:]); err != nil {
		return f, err
	}
	switch fs.NArg() {
	case 0:
		f.dir = "config/default"
	case 1:
		f.dir = fs.Arg(0)
	default:
		return f, errors.New("one kustomization directory at most")
	}
	return f, nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	f, err := parse(args)
	if err != nil {
		return err
	}
	dir := f.dir
	if len(f.images) > 0 {
		tmp, err := os.MkdirTemp("", "kmm-deploy-")
		if err != nil {
			return err
		}
		defer func() { _ = os.RemoveAll(tmp) }()
		if dir, err = install.Overlay(ctx, f.kustomize, dir, tmp, f.images); err != nil {
			return err
		}
	}
	objs, err := install.Render(ctx, f.kustomize, dir)
	if err != nil {
		return err
	}
	if f.verb == "render" {
		for _, u := range objs {
			data, err := yaml.Marshal(u.Object)
			if err != nil {
				return err
			}
			if _, err := fmt.Fprintf(out, "---\n%s", data); err != nil {
				return err
			}
		}
		return nil
	}
	cfg, err := config.GetConfig()
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: install.Scheme(nil)})
	if err != nil {
		return err
	}
	if f.verb == "delete" {
		return install.Delete(ctx, c, objs, f.force, out)
	}
	return install.Apply(ctx, c, objs, f.dryRun, out)
}
