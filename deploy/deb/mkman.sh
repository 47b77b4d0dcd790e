#!/bin/sh
# mkman.sh NAME SECTION BINARY DESCRIPTION: a man page from BINARY --help,
# so the page lists exactly the flags the binary has.
set -eu
name=$1 section=$2 bin=$3 desc=$4
date=$(date -u -d "@${SOURCE_DATE_EPOCH:-$(date +%s)}" +%Y-%m-%d)
cat <<MAN
.TH $(echo "$name" | tr a-z A-Z) $section "$date" "$name" "b2bd"
.SH NAME
$name \\- $desc
.SH SYNOPSIS
.B $name
[\\fIflags\\fR]
.SH DESCRIPTION
$desc.
MAN
if [ "$section" = 8 ]; then
	cat <<MAN
The daemon reads \\fI/etc/b2bd/b2bd.toml\\fR when started with
\\fB\\-\\-config\\fR; the file's keys are the flags' names, and flags on the
command line override it.
MAN
fi
cat <<MAN
.SH OPTIONS
The output of \\fB$name \\-\\-help\\fR:
.PP
.nf
MAN
"$bin" --help 2>&1 | sed -e 's/\\/\\\\/g' -e 's/^\([.'"'"']\)/\\\&\1/' -e 's/-/\\-/g'
cat <<MAN
.fi
.SH FILES
.TP
.I /etc/b2bd/b2bd.toml
configuration
.TP
.I /run/b2bd/b2bd.sock
the local API socket (group b2bd)
.TP
.I /dev/shm/b2bd
shared-memory files of host regions
.SH SEE ALSO
.BR systemctl (1)
MAN
