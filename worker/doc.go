// Package worker is the code of kmm's one-shot worker pods (SPEC §6): it pulls a kmod image with
// go-containerregistry into a digest-keyed cache, extracts only `<dirName>/lib/modules/<kernel>` and
// the firmware directory while refusing unsafe archive entries, removes in-tree modules, installs
// firmware, runs modprobe to load or unload the module, and reports a contract.Result that the
// operator reads from the pod's termination message. It is the node side only: the worker pod's
// labels and annotations, the Config it reads, the Result it writes and the failure classes are
// package contract, which the operator imports instead of this package.
//
// Decisions are pure functions with table tests: the modprobe command lines (LoadArgv, UnloadArgv,
// InTreeRemoveArgv, SoftdepConfig), the archive entry policy (planEntry) and the classification of
// errors into a contract.Reason. Effects on the node go through two small
// interfaces, Modprobe and Host, so the same code runs on a node (ExecModprobe, NewNodeHost with
// root "/") and in a sandbox directory (NewSandboxHost, with dry-run command lines that run the real
// `modprobe -n`).
//
// Cache layout, under Options.CacheDir (a host path in production so that a reboot does not
// download again):
//
//	<cacheDir>/<digest-hex>/<extract-key>/   an extraction root: the image's <dirName>/lib/modules/<kernel>
//	                                         and <firmwarePath> subtrees, renamed into place complete
//	<cacheDir>/refs/<sha256(reference)>.json the digest a tag resolved to, so that a later run with
//	                                         imagePullPolicy other than Always makes no registry request
//	<cacheDir>/.extract-*                    extractions in progress (removed on failure)
//	<cacheDir>/access/<digest-hex>/<identity> the credential identities (namespace, registry and
//	                                         credentials, hashed) that proved access to a digest
//	<cacheDir>/locks/<digest-hex>            flock held shared by every run using the digest;
//	                                         eviction takes it exclusively or skips the entry
//	<cacheDir>/.evict-*                      entries being removed by eviction
//
// The extract key hashes the kernel version, dirName and firmwarePath, because one image may serve
// several kernels and only the subtree for one is extracted at a time.
//
// Every run is bounded (Limits, Options.Timeout) and every limit breach is a classified failure;
// docs/worker-limits.md lists the limits, the eviction rule, the credential check and the modprobe
// path check.
package worker
