-- Aggregates for the views whose digits do not depend on the order rows reach them. DuckDB aggregates in
-- parallel and combines partial results in whatever order threads finish, so a float sum, mean or std could
-- differ in its last digits from one run of the same query to the next. These aggregate the group's values
-- in sorted order: the same values give the same digits, whatever the threads did.
CREATE OR REPLACE MACRO sorted_sum(x) AS list_sum(list(x ORDER BY x));
CREATE OR REPLACE MACRO sorted_avg(x) AS list_avg(list(x ORDER BY x));
CREATE OR REPLACE MACRO sorted_stddev_samp(x) AS list_stddev_samp(list(x ORDER BY x));
