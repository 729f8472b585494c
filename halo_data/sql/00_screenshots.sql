-- screenshots: one row per distinct screenshot hash. Copies stored by concurrent writers are hidden here; `halo-data compact` drops them from storage.
SELECT
    hash_prefix,
    hash,
    any_value(image) AS image,
    any_value(format) AS format,
    any_value(width) AS width,
    any_value(height) AS height,
    min(created_at) AS created_at
FROM screenshots_all
GROUP BY hash_prefix, hash
