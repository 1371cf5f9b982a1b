// Package kernel parses Linux kernel version strings as nodes report them, compares them, matches
// them against version ranges such as ">=5.14.0 <6.0", and expands the $KERNEL_* and $MOD_* variables
// of kmod image references. It is pure: no I/O, no clock.
//
// Comparison rule: a kernel version is its dot-separated numeric release (5.14.0), then the leading
// number of the part after the first '-' as a build number (553 in 5.14.0-553.el9.x86_64, 56 in
// 6.1.0-56-cloud-amd64, 0 when there is none); the rest of the suffix is ignored. Components compare
// as numbers, so 5.10 > 5.4. A trailing '+' is ignored. A range bound compares only the components
// it names: "<6.0" excludes every 6.0.x, ">=5.14" admits 5.14.0-553, and the build number takes
// part only when the bound has one ("<5.14.0-600").
package kernel
