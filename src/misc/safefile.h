/* Folders and files Chorus writes where another user of the machine may reach (/tmp, a shared
 * TMPDIR): every writer (flight recorder dumps, traces, the debug log, chorus-info's outputs) goes
 * through these, so that a folder or file planted by someone else is refused rather than used.
 * docs/SECURITY.md, "Local attackers", says what this protects and what not. Nothing here logs: the
 * caller words the WARN (the debug log itself uses sf_append). */
#ifndef CHORUS_MISC_SAFEFILE_H
#define CHORUS_MISC_SAFEFILE_H

#include <stddef.h>
#include <stdio.h>

/* Opens folder `path` to write files into: missing folders on the way are made (mode 0700) when
 * `create`. The last must not be a symbolic link, must be owned by this user (euid) or root, and if
 * others can write it, it must be sticky (as /tmp: they may add names but never touch ours); *shared
 * (may be NULL) says which. A symbolic link on the way is followed only out of a folder nobody else
 * can write (root's or ours, no group/other write), so none planted by another user redirects us.
 * Returns an O_DIRECTORY descriptor, or -1 with errno set and `why` saying what was wrong. */
int sf_dir(const char* path, int create, int* shared, char* why, size_t len);

/* Opens the folder that holds the file `path` (a tool's output, the debug log) as sf_dir does, making
 * none. *base gets the file's name within `path`. */
int sf_parent_dir(const char* path, const char** base, char* why, size_t len);

/* Creates `name` in dirfd, new (O_CREAT|O_EXCL|O_NOFOLLOW|O_NONBLOCK, mode 0600, plus `flags`): a
 * symbolic link, FIFO or file planted there is refused, never opened or followed. `replace`: an
 * existing entry is unlinked first; only for folders that are not shared, where it can only be ours. */
int sf_create(int dirfd, const char* name, int flags, int replace);

/* A file written under a fresh temporary name and renamed into place when complete (a reader never
 * sees half of it; a planted temporary name cannot be opened). */
struct sf_file {
  FILE* f;
  int dirfd, own_dir;
  char tmp[300], name[256];
};
/* In an open folder (sf_dir). Returns 0, or -1 with errno set. */
int sf_open_in(struct sf_file* s, int dirfd, const char* name);
/* At `path`, whose folder is checked by sf_parent_dir. In a folder nobody else can write, the file is
 * written in place as named (a link of the user's, /dev/stdout); in a shared one, as sf_open_in. */
int sf_open_path(struct sf_file* s, const char* path, char* why, size_t len);
/* Closes and renames into place: 0, or -1 with errno set (the temporary file is removed). */
int sf_commit(struct sf_file* s);
/* Closes and removes the temporary file. */
void sf_abandon(struct sf_file* s);

/* Opens `path` for appending (processes may share the name): its folder as sf_parent_dir; in a
 * shared folder the file must not be a link and, if it exists, must be a regular file of this user.
 * -1 with errno set otherwise. */
int sf_append(const char* path, int mode);

#endif
