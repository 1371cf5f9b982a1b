// Package sign appends Linux kernel module signatures to .ko files, in the format the kernel's
// scripts/sign-file writes, and signs the modules of a container image (issue 37, item 4).
//
// A signed module is the module's bytes followed by a PKCS#7/CMS SignedData (DER) over them, the
// 12-byte struct module_signature trailer (id_type PKEY_ID_PKCS7, sig_len big-endian, every other
// field zero) and the magic "~Module signature appended~\n". The SignedData is what sign-file
// writes by default: content detached, no certificates, no signed attributes (so the signature is
// over the module bytes themselves), one signer named by the issuer and serial number of its
// certificate, rsaEncryption (or ecdsa-with-SHA*) as the signature algorithm and the digest
// algorithm of Options.Hash (SHA-256 by default). For an RSA key the output is byte for byte what
// `openssl cms -sign -binary -noattr -nocerts` (sign-file's flags) writes.
//
// The key and the certificate come in upstream KMM's Secret formats: the private key (Secret key
// "key") and the certificate (Secret key "cert"), each PEM or DER; a key that does not match its
// certificate is refused. Image pulls an image, signs the files that filesToSign's globs
// match, writes them as one new layer on top and pushes the result under another name; the worker
// runs it as `worker sign` in the sign pod. docs/sign.md says how, and lists every bound.
//
// The package talks to no API server: like worker/, it imports nothing of the operator and no
// controller-runtime (depguard rule sign-independent).
package sign
