// Package archtest checks that docs/architecture.md tells the truth about the package graph: its
// import table lists every production package and exactly the kmm packages each one imports.
package archtest
