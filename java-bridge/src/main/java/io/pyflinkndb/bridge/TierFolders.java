package io.pyflinkndb.bridge;

import java.io.IOException;
import java.nio.file.FileVisitResult;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.SimpleFileVisitor;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.LinkedHashSet;
import java.util.Set;

/**
 * The tier-2 folders of this JVM's embedded interpreter ({@code <base>/pyflink-ndb/p<pid>-<id>},
 * one per base folder), deleted when the JVM exits normally or on SIGTERM: tier 2 never
 * outlives its process, and the tiers that failed or cancelled attempts left for their next
 * attempt ({@code local.recovery}) would otherwise stay on disk when the TaskManager (or a
 * local MiniCluster) stops before one comes (a breaker's find). The embedded CPython does not
 * run its {@code atexit} handlers when the JVM exits.
 */
final class TierFolders {
    private static final Set<Path> FOLDERS = new LinkedHashSet<>();
    private static boolean hooked;

    private TierFolders() {}

    /** Delete {@code folder} (recursively) when the JVM exits. */
    static synchronized void deleteAtExit(String folder) {
        FOLDERS.add(Paths.get(folder));
        if (!hooked) {
            hooked = true;
            Runtime.getRuntime()
                    .addShutdownHook(new Thread(TierFolders::deleteAll, "pyflink-ndb-tier2-exit"));
        }
    }

    private static synchronized void deleteAll() {
        for (Path folder : FOLDERS) {
            try {
                deleteRecursively(folder);
            } catch (IOException | RuntimeException e) {
                // Exiting: nothing to tell anyone; the folder stays.
            }
        }
    }

    private static void deleteRecursively(Path folder) throws IOException {
        if (!Files.exists(folder)) {
            return;
        }
        Files.walkFileTree(
                folder,
                new SimpleFileVisitor<Path>() {
                    @Override
                    public FileVisitResult visitFile(Path file, BasicFileAttributes attrs)
                            throws IOException {
                        Files.deleteIfExists(file);
                        return FileVisitResult.CONTINUE;
                    }

                    @Override
                    public FileVisitResult postVisitDirectory(Path dir, IOException exc)
                            throws IOException {
                        Files.deleteIfExists(dir);
                        return FileVisitResult.CONTINUE;
                    }
                });
    }
}
