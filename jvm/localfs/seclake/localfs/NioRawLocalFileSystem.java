package seclake.localfs;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system, with the two calls that fork a process on every file done in the JVM.
 *
 * Without Hadoop's native library (pip's pyspark ships none), RawLocalFileSystem runs `chmod` for
 * the permission of every file it creates (each data file, its .crc, each Delta commit, each
 * checkpoint file) and `readlink` for both sides of every rename (each Delta commit, each
 * streaming checkpoint file). A fork from a JVM of gigabytes costs milliseconds to tens of
 * milliseconds on 2 cores; java.nio does the same in microseconds. Symbolic links and modes
 * java.nio cannot set (setuid, setgid, sticky) still go through Hadoop's own code.
 */
public class NioRawLocalFileSystem extends RawLocalFileSystem {
    private static final PosixFilePermission[] BITS = {
        PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
        PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
        PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
    };

    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
        int mode = permission.toShort();
        if ((mode & ~0777) != 0) {
            super.setPermission(p, permission);
            return;
        }
        Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
        for (int bit = 0; bit < BITS.length; bit++) {
            if ((mode & (1 << bit)) != 0) {
                set.add(BITS[bit]);
            }
        }
        Files.setPosixFilePermissions(pathToFile(p).toPath(), set);
    }

    @Override
    public FileStatus getFileLinkStatus(Path f) throws IOException {
        // Not a link: the link's status is the file's own, which Hadoop reads without a fork.
        if (!Files.isSymbolicLink(pathToFile(f).toPath())) {
            return getFileStatus(f);
        }
        return super.getFileLinkStatus(f);
    }
}
