package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/internal/logging"
	"github.com/kmm-project/kmm/registry"
	"github.com/kmm-project/kmm/sign"
)

// signFlags are the settings of `worker sign`.
//
//	worker sign --config <file> [--key <file>] [--cert <file>] [--hash sha256|sha384|sha512]
//	       [--pull-secret <docker-config>] [--pull-secret-dir <dir>] [the registry flags of load]
//	       [--termination-log <file>] [--timeout <duration>] [--max-module-bytes <n>]
//	       [--max-files <n>] [--max-image-bytes <n>] [--max-tar-bytes <n>] [--log-level <level>] [--log-console]
type signFlags struct {
	flags
	key, cert, hash string
	maxModuleBytes  int64
	maxFiles        int
}

func parseSignFlags(args []string, errOut io.Writer) (signFlags, error) {
	var f signFlags
	fs := flag.NewFlagSet("worker sign", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.Usage = func() {
		_, _ = fmt.Fprintln(errOut, "usage: worker sign --config <file> [flags]")
		fs.PrintDefaults()
	}
	fs.StringVar(&f.config, "config", "", "Sign config file (contract.SignConfig, JSON or YAML). Required.")
	fs.StringVar(&f.key, "key", contract.SignKeyFile, "Private key file (PEM or DER), the keySecret's key \"key\".")
	fs.StringVar(&f.cert, "cert", contract.SignCertFile, "Certificate file (PEM or DER), the certSecret's key \"cert\".")
	fs.StringVar(&f.hash, "hash", "sha256", "Digest algorithm: sha256, sha384 or sha512.")
	fs.StringVar(&f.pullSecret, "pull-secret", "", "Pull secret in docker-config form, for the pull and the push; empty for anonymous access.")
	fs.StringVar(&f.terminationLog, "termination-log", "/dev/termination-log", "File the JSON result is written to.")
	fs.DurationVar(&f.timeout, "timeout", contract.DefaultSignTimeout, "Deadline of the whole run (pull, signing, push).")
	fs.Int64Var(&f.maxModuleBytes, "max-module-bytes", sign.DefaultMaxModuleBytes, "Cap on one module's bytes.")
	fs.IntVar(&f.maxFiles, "max-files", sign.DefaultMaxFiles, "Cap on the files signed in the image.")
	fs.Int64Var(&f.maxImageBytes, "max-image-bytes", sign.DefaultMaxImageBytes, "Cap on the compressed bytes of the unsigned image's layers.")
	fs.Int64Var(&f.maxTarBytes, "max-tar-bytes", sign.DefaultMaxTarBytes, "Cap on the uncompressed bytes read from the unsigned image's layers.")
	fs.StringVar(&f.logLevel, "log-level", "info", "Log level: debug, info, warn or error.")
	fs.BoolVar(&f.logConsole, "log-console", false, "Log human-readable text instead of JSON.")
	registryFlags(fs, &f.flags)
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	switch {
	case fs.NArg() > 0:
		return f, fmt.Errorf("unexpected arguments %q", fs.Args())
	case f.config == "":
		return f, errors.New("--config is required")
	case f.timeout <= 0:
		return f, fmt.Errorf("--timeout must be positive, got %s", f.timeout)
	case f.registry.Check() != nil:
		return f, f.registry.Check()
	}
	return f, nil
}

// runSign is `worker sign`; it returns the exit status, as run does.
func runSign(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f, err := parseSignFlags(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			_, _ = fmt.Fprintln(stderr, "worker sign:", err)
		}
		return exitUsage
	}
	log, err := logging.New(stderr, f.logLevel, f.logConsole)
	if err != nil {
		_, _ = fmt.Fprintln(stderr, "worker sign:", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	return report(executeSign(ctx, f, log), f.terminationLog, "worker sign", stdout, stderr)
}

// executeSign reads the config, the key pair and the credentials, and signs the image.
func executeSign(ctx context.Context, f signFlags, log logr.Logger) contract.Result {
	start := time.Now()
	cfg, err := contract.ReadSignConfig(f.config)
	res := contract.Result{Action: contract.ActionSign, Namespace: cfg.Namespace, Name: cfg.Name, Kernel: cfg.Kernel}
	if err != nil {
		return signFailure(res, contract.ReasonInvalidConfig, err)
	}
	s, err := signer(f)
	if err != nil {
		return signFailure(res, signReason(err), err)
	}
	kc, err := keychain(f.flags)
	if err != nil {
		return signFailure(res, contract.ReasonImagePull, err)
	}
	out, err := sign.Image(ctx, s, sign.ImageOptions{
		Source:      cfg.UnsignedImage,
		SourceTLS:   registry.ModuleTLS{Insecure: cfg.UnsignedImageRegistryTLS.Insecure, SkipVerify: cfg.UnsignedImageRegistryTLS.InsecureSkipTLSVerify},
		Target:      cfg.Image,
		TargetTLS:   registry.ModuleTLS{Insecure: cfg.RegistryTLS.Insecure, SkipVerify: cfg.RegistryTLS.InsecureSkipTLSVerify},
		FilesToSign: cfg.FilesToSign,
		Registries:  f.registry.Sources,
		Trust:       f.registry.Trust,
		Keychain:    kc,
		Limits:      sign.ImageLimits{MaxFiles: f.maxFiles, MaxImageBytes: f.maxImageBytes, MaxTarBytes: f.maxTarBytes},
	})
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("timed out after %s: %w", f.timeout, err)
		}
		return signFailure(res, signReason(err), err)
	}
	paths := make([]string, 0, len(out.Files))
	for _, file := range out.Files {
		paths = append(paths, file.Path)
	}
	log.Info("signed", "image", cfg.Image, "digest", out.Digest.String(), "files", strings.Join(paths, ","), "duration", time.Since(start).String())
	res.Outcome, res.ImageDigest = contract.OutcomeSucceeded, out.Digest.String()
	return res
}

// signer reads the key pair and makes the Signer of the flags.
func signer(f signFlags) (*sign.Signer, error) {
	h, err := sign.ParseHash(f.hash)
	if err != nil {
		return nil, err
	}
	key, cert, err := sign.ReadKeyPair(f.key, f.cert)
	if err != nil {
		return nil, err
	}
	return sign.NewSigner(key, cert, sign.Options{Hash: h, MaxModuleBytes: f.maxModuleBytes})
}

// signReason maps a sign failure class to the contract's reason.
func signReason(err error) contract.Reason {
	switch sign.ClassOf(err) {
	case sign.ClassKey, sign.ClassKeyMismatch:
		return contract.ReasonSignKey
	case sign.ClassNotModule, sign.ClassMalformedSignature, sign.ClassNoMatch, sign.ClassTooLarge:
		return contract.ReasonSignInput
	case sign.ClassInvalidInput:
		return contract.ReasonInvalidConfig
	case sign.ClassPull:
		return contract.ReasonImagePull
	case sign.ClassPush:
		return contract.ReasonImagePush
	}
	return contract.ReasonOther
}

func signFailure(res contract.Result, reason contract.Reason, err error) contract.Result {
	res.Outcome, res.Reason, res.Message = contract.OutcomeFailed, reason, err.Error()
	return res
}
